"""Start and stop the TFF C++ runtime this package computes on.

Importing this package makes TFF's default context (what runs a
computation called outside the context managers below, e.g. in a notebook)
the in-process runtime, started on first use and closed at exit: TFF's own
default starts a `worker_binary` that outlives the script and holds its
stdout open. The entry points replace it by one that refuses to run
(`refuse_unmanaged_default_context()`, from `fl_common.default_context`):
each of their computations runs inside one of the context managers below.

* `local_runtime()` runs every TFF computation of the block in this
  process's own TensorFlow (`in_process`), on its GPUs if it has any, else
  on its CPU cores; no worker process;
* `worker_runtime()` starts one local `worker_binary` it owns (`workers`) and
  runs every TFF computation of the block on it (TFF's C++ runtime, CPU
  only);
* `remote_runtime(addresses)` spreads each computation over workers started
  by hand on other machines (`worker_binary --port=PORT`): the cohort is
  split into one slice per worker, the workers train their slices at the
  same time, and a worker that dies or hangs ends the run with a
  `WorkerUnavailableError` naming it (`stubs`) instead of TFF's endless
  retries.

Modules: `in_process` (the in-process executor and devices), `workers`
(processes), `stubs` (gRPC and health probes), `contexts` (execution
contexts, cohort splitting). This package holds most of the package's uses
of TFF's private API, each imported through `fl_common.tff_private` (the
one door to it, with the reasons).
"""

import atexit
import contextlib
import functools
import threading
from collections.abc import Iterator, Sequence
from typing import Any, Optional

import tensorflow_federated as tff

from fl_common.tff_private import context_base
from fl_common.tff_private import context_stack_impl
from fl_common.tff_private import remote_executor_grpc_stub


from fl_engine.runtime import contexts
from fl_engine.runtime import in_process
from fl_engine.runtime.contexts import _DeviceContext
from fl_engine.runtime.contexts import _InProcessContext
from fl_engine.runtime.contexts import _CohortSplittingContext
from fl_engine.runtime.contexts import _sync_context
from fl_engine.runtime.contexts import _WorkerContext
from fl_engine.runtime.stubs import _check_worker_addresses
from fl_engine.runtime.stubs import _connect
from fl_engine.runtime.stubs import _WorkerStub
from fl_engine.runtime.stubs import WorkerUnavailableError
from fl_engine.runtime.workers import cores_available
from fl_engine.runtime.workers import start_worker
from fl_engine.runtime.workers import stop_all_workers
from fl_engine.runtime.workers import stop_worker
from fl_engine.runtime.workers import WORKER_BINARY_PATH
from fl_engine.runtime.workers import worker_intra_op_threads
from fl_common import default_context
from fl_common.default_context import refuse_unmanaged_default_context

__all__ = [
    'WORKER_BINARY_PATH',
    'WorkerUnavailableError',
    'cores_available',
    'install',
    'local_context',
    'local_runtime',
    'refuse_unmanaged_default_context',
    'remote_runtime',
    'visible_devices',
    'worker_runtime',
    'start_worker',
    'stop_all_workers',
    'stop_worker',
    'worker_intra_op_threads',
]


visible_devices = in_process.visible_devices


# The runtimes entered and not yet exited, innermost last.
_OPEN_RUNTIMES: list[contextlib.AbstractContextManager] = []


class _ExitedAtShutdown(contextlib.AbstractContextManager):
  """A runtime's context manager that, if entered and never exited (a
  notebook's `__enter__()`), is exited at interpreter exit by an `atexit`
  hook, while the modules it needs still exist: left to the garbage
  collector at shutdown, its generator ran with module globals already
  cleared and Python printed an `Exception ignored ... TypeError`."""

  def __init__(self, manager: contextlib.AbstractContextManager):
    self._manager = manager

  def __enter__(self):
    value = self._manager.__enter__()
    _OPEN_RUNTIMES.append(self._manager)
    return value

  def __exit__(self, *exc_info):
    if self._manager in _OPEN_RUNTIMES:
      _OPEN_RUNTIMES.remove(self._manager)
    return self._manager.__exit__(*exc_info)


def _runtime(function):
  """`contextlib.contextmanager`, exited at interpreter exit if left open."""
  manager = contextlib.contextmanager(function)

  @functools.wraps(function)
  def make(*args, **kwargs):
    return _ExitedAtShutdown(manager(*args, **kwargs))

  return make


@atexit.register
def _exit_open_runtimes() -> None:
  while _OPEN_RUNTIMES:
    _OPEN_RUNTIMES.pop().__exit__(None, None, None)


def _check_max_clients_per_call(max_clients_per_call: Optional[int]) -> None:
  if max_clients_per_call is not None and max_clients_per_call < 1:
    raise ValueError('max_clients_per_call must be positive, got '
                     f'{max_clients_per_call}.')


@_runtime
def local_runtime(
    devices: Optional[Sequence[str]] = None,
    max_clients_per_call: Optional[int] = None,
    record_placement: bool = False,
) -> Iterator[list[in_process.Device]]:
  """Runs TFF computations in this process's TensorFlow during the block.

  Every computation is compiled as for TFF's worker and evaluated here
  (`in_process`): its TensorFlow runs in sessions of this process, on
  `devices`. With one device, a computation runs whole on it, its clients
  up to `Device.lanes` at a time. With several, each computation's cohort
  is cut into one contiguous slice per device (as over remote workers,
  `contexts._CohortSplittingContext`): the devices train their slices at
  the same time, the partial aggregates are merged and the server update
  runs on the first device.

  Args:
    devices: TensorFlow device names (`GPU:0`, `GPU:1`, `CPU:0`); default:
      every visible GPU, else the CPU (`in_process.plan_devices`).
    max_clients_per_call: `None` (default): a cohort is cut only over the
      devices. Otherwise into slices of at most this many clients each, run
      one after the other on each device, whose partial aggregates are
      merged: memory then grows with this number instead of the cohort
      size (sums are taken in another order, equal up to float rounding).
    record_placement: Whether each device counts the ops each TensorFlow
      device ran (`Device.placement`); every call is traced, slower.

  Yields:
    The `in_process.Device`s the block computes on.

  Raises:
    ValueError: If a device is not visible or `max_clients_per_call` is not
      positive.
  """
  with local_context(devices, max_clients_per_call,
                     record_placement) as (context, planned):
    with context_stack_impl.context_stack.install(context):
      yield planned


def install(context: context_base.SyncContext):
  """Installs `context` (from `local_context`) for a `with` block."""
  return context_stack_impl.context_stack.install(context)


@contextlib.contextmanager
def local_context(
    devices: Optional[Sequence[str]] = None,
    max_clients_per_call: Optional[int] = None,
    record_placement: bool = False,
) -> Iterator[tuple[context_base.SyncContext, list[in_process.Device]]]:
  """`local_runtime`'s execution context and devices, not installed: for a
  caller that runs some computations in it and others elsewhere (the
  benchmark's side-by-side rounds: `context_stack.install(context)` around
  each call)."""
  _check_max_clients_per_call(max_clients_per_call)
  planned = in_process.plan_devices(devices,
                                    record_placement=record_placement)
  context = None
  try:
    if len(planned) == 1 and max_clients_per_call is None:
      context = _InProcessContext(planned[0])
    else:
      context = _CohortSplittingContext(
          [_DeviceContext(d) for d in planned],
          max_clients_per_slice=max_clients_per_call)
    yield context, planned
  finally:
    if isinstance(context, _InProcessContext):
      context.close()
    for device in planned:
      device.close()


@_runtime
def worker_runtime(
    max_concurrent_clients: Optional[int] = None,
    max_clients_per_call: Optional[int] = None,
    keep_state_on_worker: bool = False,
) -> Iterator[str]:
  """Runs TFF computations on one local worker for the duration of the block.

  TFF's C++ `worker_binary` (TensorFlow 2.14, CPU only), started and owned
  here: the runtime of TFF itself, which `local_runtime` reproduces in this
  process. The choice where a run must match TFF's own runtime, or for the
  same engine as remote workers.

  Args:
    max_concurrent_clients: How many client computations the worker runs at
      once; `None` (default): one per core; non-positive: no limit (see
      `start_worker`).
    max_clients_per_call: `None` (default): each computation runs whole on
      the worker. Otherwise a round's cohort is run in slices of at most this
      many clients, one after the other, whose partial aggregates are merged
      (`_CohortSplittingContext`): the worker's memory then grows with this
      number instead of the cohort size (it holds several model-sized values
      per client of a call: ~23 GB for 200 clients of the Stack Overflow
      LSTM). Sums are then taken in another order, equal up to float
      rounding, and a worker that dies ends the block with a
      `WorkerUnavailableError` instead of TFF's endless retries. Either way
      (with `keep_state_on_worker` or a cap), a call whose clients' NumPy
      arrays (fused shards) exceed `contexts.MAX_BYTES_PER_SLICE` is cut
      into slices of at most that size.
    keep_state_on_worker: Whether `next` of a learning (or iterative)
      process leaves the new server state on the worker, returning a
      `worker_state.StateOnWorker` handle in its place, which the next call
      takes by reference (`fl_engine.worker_state`; the training
      loop's setting). `worker_state.fetch` turns it into a Python value.
      Computations whose cohort is split over slices fetch it first. With
      it, each computation (also a slice's) is sent to the worker once and
      reused there, instead of at every call.

  Yields:
    The worker's address.

  Raises:
    ValueError: If `max_clients_per_call` is not positive.
  """
  _check_max_clients_per_call(max_clients_per_call)
  process, address = start_worker(max_concurrent_clients=max_concurrent_clients)
  stub = None
  try:
    channel = _connect(address, timeout_seconds=60)
    if max_clients_per_call is None and not keep_state_on_worker:
      context = _sync_context(
          remote_executor_grpc_stub.RemoteExecutorGrpcStub(channel))
    else:
      stub = _WorkerStub(address, channel, probe_interval_seconds=10.0,
                         probe_timeout_seconds=20.0)
      context = _CohortSplittingContext(
          [_WorkerContext(stub, keep_state_on_worker)],
          max_clients_per_slice=max_clients_per_call,
          max_bytes_per_slice=contexts.MAX_BYTES_PER_SLICE)
    with context_stack_impl.context_stack.install(context):
      yield address
  finally:
    if stub is not None:
      stub.close()
    stop_worker(process)


@_runtime
def remote_runtime(
    addresses: Sequence[str],
    connect_timeout_seconds: float = 30.0,
    probe_interval_seconds: float = 10.0,
    probe_timeout_seconds: float = 20.0,
    keep_state_on_worker: bool = False,
) -> Iterator[None]:
  """Spreads each TFF computation over the workers at `addresses`.

  Each round's cohort is split into one contiguous part per worker
  (`_CohortSplittingContext`); each worker runs its part's client work and
  partial aggregation, at the same time as the others, and the parts are
  merged here. Computations without clients (initialization, reading model
  weights) run their server part on the first worker.

  A worker that drops the connection, restarted, or does not answer a health
  probe within `probe_timeout_seconds` (probes are sent every
  `probe_interval_seconds` while a call is outstanding) ends the block with a
  `WorkerUnavailableError` naming it; nothing is retried.

  Args:
    addresses: `host:port` of each worker's executor service
      (`worker_binary --port=PORT`), distinct.
    connect_timeout_seconds: How long to wait for each worker at the start.
    probe_interval_seconds: How often a worker with a call outstanding is
      probed.
    probe_timeout_seconds: How long a probe may go unanswered.
    keep_state_on_worker: As for `worker_runtime`; the state stays on the
      worker only with one worker (with more, every cohort is split over
      them), computations are sent once to each worker in either case.

  Raises:
    ValueError: If an address is not `host:port` or is repeated.
    WorkerUnavailableError: If a worker cannot be reached or fails.
  """
  _check_worker_addresses(addresses)
  stubs = []
  try:
    for address in addresses:
      stubs.append(_WorkerStub(
          address, _connect(address, connect_timeout_seconds),
          probe_interval_seconds, probe_timeout_seconds))
    context = _CohortSplittingContext(
        [_WorkerContext(s, keep_state_on_worker) for s in stubs],
        max_bytes_per_slice=contexts.MAX_BYTES_PER_SLICE)
    with context_stack_impl.context_stack.install(context):
      yield
  finally:
    for stub in stubs:
      stub.close()


class _ManagedDefaultContext(context_base.SyncContext):
  """`local_context()`'s context on the default devices, made on the first
  computation run outside any runtime and closed at exit (module
  docstring)."""

  def __init__(self):
    self._lock = threading.Lock()
    self._stack: Optional[contextlib.ExitStack] = None
    self._context: Optional[context_base.SyncContext] = None

  def invoke(self, comp: Any, arg: Any) -> Any:
    with self._lock:
      if self._context is None:
        stack = contextlib.ExitStack()
        self._context, _ = stack.enter_context(local_context())
        self._stack = stack
        atexit.register(self.close)
    return self._context.invoke(comp, arg)

  def close(self) -> None:
    with self._lock:
      if self._stack is not None:
        self._stack.close()
      self._stack, self._context = None, None


def _manage_default_context() -> None:
  tff.framework.set_default_context(_ManagedDefaultContext())
  # TFF's own, dropped now rather than at exit.
  default_context.collect_replaced_context()


_manage_default_context()
