"""Start and stop the TFF C++ runtime this package computes on.

TFF's own `set_sync_local_cpp_execution_context` starts a `worker_binary`
subprocess that outlives Python and keeps the parent's stdout open, which
hangs pipes and CI. Here the package starts the executor service itself, so it
owns the process:

* the worker is started under `setpriv --pdeathsig KILL`, so the kernel
  kills it when the Python process dies for any reason (even `SIGKILL`);
* `local_runtime()` is a context manager that stops it on exit, and an
  `atexit` hook stops anything still running.

`remote_runtime(addresses)` instead spreads each computation over workers
started by hand on other machines (`worker_binary --port=PORT`): the cohort
is split into one slice per worker, the workers train their slices at the
same time, and a worker that dies or hangs ends the run with a
`WorkerUnavailableError` naming it instead of TFF's endless retries.

Every entry point (`run_experiment.py`, the benchmarks, the test suite) goes
through this module.
"""

import asyncio
import atexit
import contextlib
import gc
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Optional

from absl import logging
import grpc
import portpicker
import tensorflow_federated as tff
from tensorflow_federated.proto.v0 import executor_pb2
from tensorflow_federated.python.common_libs import async_utils
from tensorflow_federated.python.common_libs import structure
from tensorflow_federated.python.core.backends.native import compiler
from tensorflow_federated.python.core.backends.native import mergeable_comp_compiler
from tensorflow_federated.python.core.environments.tensorflow_frontend import tensorflow_computation
from tensorflow_federated.python.core.impl.context_stack import context_base
from tensorflow_federated.python.core.impl.context_stack import context_stack_impl
from tensorflow_federated.python.core.impl.context_stack import runtime_error_context
from tensorflow_federated.python.core.impl.execution_contexts import async_execution_context
from tensorflow_federated.python.core.impl.execution_contexts import compiler_pipeline
from tensorflow_federated.python.core.impl.execution_contexts import mergeable_comp_execution_context
from tensorflow_federated.python.core.impl.execution_contexts import sync_execution_context
from tensorflow_federated.python.core.impl.executor_stacks import python_executor_stacks
from tensorflow_federated.python.core.impl.executors import cardinalities_utils
from tensorflow_federated.python.core.impl.executors import executors_errors
from tensorflow_federated.python.core.impl.executors import remote_executor_grpc_stub
from tensorflow_federated.python.core.impl.types import type_analysis
from tensorflow_federated.python.core.impl.types import type_conversions

from experiment_driver import value_transfer
from experiment_driver import worker_state

WORKER_BINARY_PATH = os.path.join(
    os.path.dirname(tff.__file__), 'data', 'worker_binary'
)
_GRPC_MAX_MESSAGE_BYTES = 2 * 1000 * 1000 * 1000
_GRPC_OPTIONS = [
    ('grpc.max_message_length', _GRPC_MAX_MESSAGE_BYTES),
    ('grpc.max_receive_message_length', _GRPC_MAX_MESSAGE_BYTES),
    ('grpc.max_send_message_length', _GRPC_MAX_MESSAGE_BYTES),
]
# Sets the worker's parent-death signal (`PR_SET_PDEATHSIG`, kept across
# `exec`) before it becomes `worker_binary`. Setting it in the child from a
# `preexec_fn` instead would make `subprocess` fork for real, which runs
# gRPC's fork handlers in the child: with a gRPC call in flight on another
# thread the child once deadlocked in them (`__run_postfork_handlers`),
# before its `exec`. Without a `preexec_fn`, CPython starts the child with
# `vfork`, which runs no fork handlers.
_DIE_WITH_PARENT = ('setpriv', '--pdeathsig', 'KILL')
# glibc malloc settings for a worker started here: large buffers (a round's
# model-sized values: the state parsed from the request, each client's
# variables and update, the result) come from a heap kept mapped instead of
# fresh `mmap`s whose every page faults in zeroed and is unmapped when freed.
# `perf` on the worker: page faults and page zeroing were ~20 % of its CPU in
# a 1-client EMNIST CNN round; with these, its CPU per round fell 35 %
# (46 -> 30 ms) and the round 10-20 %. The worker keeps its peak heap.
_WORKER_MALLOC_ENV = {
    'MALLOC_MMAP_THRESHOLD_': str(1 << 30),
    'MALLOC_TRIM_THRESHOLD_': str(1 << 32),
    'MALLOC_TOP_PAD_': str(1 << 28),
}
# TFF's own split of a computation's argument into one slice of the clients
# per worker, and the inverse for its result (pinned TFF 0.87).
_MergeableArg = (
    mergeable_comp_execution_context.MergeableCompExecutionContextValue)
_join_result_slices = (
    mergeable_comp_execution_context._repackage_partitioned_values)  # pylint: disable=protected-access
_started_workers: list[subprocess.Popen] = []


def _drop_tff_default_context() -> None:
  """Replaces the context TFF installs at import, which would start its own
  unmanaged worker, by one that refuses to run: every computation must run
  inside `local_runtime()` or `remote_runtime()`. Dropping it now (rather than
  at interpreter exit, when `subprocess` is gone) also silences the
  `ServiceManager.__del__` traceback TFF prints at exit.
  """
  context_stack_impl.context_stack.set_default_context(
      runtime_error_context.RuntimeErrorContext())
  gc.collect()


_drop_tff_default_context()


class WorkerUnavailableError(RuntimeError):
  """A TFF worker could not be reached, failed or stopped answering."""


def cores_available() -> int:
  """How many cores this process (and a worker it starts) may run on."""
  return len(os.sched_getaffinity(0))


def worker_intra_op_threads(max_concurrent_clients: int) -> int:
  """The intra-op threads each of a worker's client computations gets.

  TensorFlow gives every session (one per client computation) a pool of one
  thread per core for its large ops, so `max_concurrent_clients` concurrent
  clients would run that many pools on the same cores. The worker instead
  gets `TF_NUM_INTRAOP_THREADS` = cores / concurrent clients (at least 1;
  1 with no limit), and parallelism comes from running clients side by side.
  Measured with `bench/` on 2 cores, 50 clients per round, two clients at
  once: a full driver round went from 1.27x to 1.03x the limit (EMNIST CNN)
  and from 1.36x to 1.26x (Stack Overflow LSTM); its CPU time fell 6-18 %.

  Args:
    max_concurrent_clients: As in `start_worker` (non-positive: no limit).
  """
  if max_concurrent_clients <= 0:
    return 1
  return max(1, cores_available() // max_concurrent_clients)


def start_worker(
    port: Optional[int] = None, max_concurrent_clients: Optional[int] = None
) -> tuple[subprocess.Popen, str]:
  """Starts one `worker_binary` on localhost; returns it and its address.

  Args:
    port: The port to serve on; a free one is picked when `None`.
    max_concurrent_clients: The worker's `--max_concurrent_computation_calls`:
      how many client computations run at once (non-positive: no limit).
      `None`: one per core (`cores_available()`), each with its share of
      the cores (`worker_intra_op_threads`). With no limit, every client of
      a round starts at once and they contend for the cores and memory (one
      TensorFlow session each): measured with `bench/` on the EMNIST CNN, 30
      clients per round on 1 core (`taskset -c 0`), one per core took 0.96x
      the limit's time and no limit 40x.

  Raises:
    RuntimeError: If `setpriv` (util-linux), which starts the worker, is
      missing.
  """
  if shutil.which(_DIE_WITH_PARENT[0]) is None:
    raise RuntimeError(
        f'`{_DIE_WITH_PARENT[0]}` (util-linux) is not on PATH; the TFF worker'
        ' is started through it so that it dies with this process. Install'
        ' util-linux (apt-get install util-linux).')
  if max_concurrent_clients is None:
    max_concurrent_clients = cores_available()
  threads = worker_intra_op_threads(max_concurrent_clients)
  port = port or portpicker.pick_unused_port()
  process = subprocess.Popen(
      [
          *_DIE_WITH_PARENT,
          WORKER_BINARY_PATH,
          f'--port={port}',
          f'--max_concurrent_computation_calls={max_concurrent_clients}',
      ],
      stdin=subprocess.DEVNULL,
      stdout=subprocess.DEVNULL,
      stderr=subprocess.DEVNULL,
      env={**os.environ, **_WORKER_MALLOC_ENV,
           'TF_NUM_INTRAOP_THREADS': str(threads)},
  )
  _started_workers.append(process)
  return process, f'localhost:{port}'


def stop_worker(process: subprocess.Popen) -> None:
  """Stops a worker started by `start_worker` and reaps it."""
  if process.poll() is None:
    process.terminate()
    try:
      process.wait(timeout=10)
    except subprocess.TimeoutExpired:
      process.kill()
      process.wait()
  if process in _started_workers:
    _started_workers.remove(process)


@atexit.register
def stop_all_workers() -> None:
  """Stops every worker this process started (also registered at exit)."""
  for process in list(_started_workers):
    stop_worker(process)


def _health_probe(channel: grpc.Channel) -> grpc.UnaryUnaryMultiCallable:
  """A call any gRPC server answers at once (if only with UNIMPLEMENTED)."""
  return channel.unary_unary(
      '/grpc.health.v1.Health/Check',
      request_serializer=lambda request: request,
      response_deserializer=lambda response: response)


def _connect(address: str, timeout_seconds: float) -> grpc.Channel:
  """Returns a gRPC channel to the executor service at `address`, ready.

  Readiness is one health probe that waits for the connection, not
  `grpc.channel_ready_future`, whose connectivity-polling thread can outlive
  the channel and fail with "Channel closed!" when the channel is closed.
  """
  channel = grpc.insecure_channel(address, _GRPC_OPTIONS)
  try:
    _health_probe(channel)(b'', timeout=timeout_seconds, wait_for_ready=True)
  except grpc.RpcError as e:
    if e.code() in (grpc.StatusCode.UNAVAILABLE,
                    grpc.StatusCode.DEADLINE_EXCEEDED):
      channel.close()
      raise WorkerUnavailableError(
          f'TFF worker at {address} did not answer within {timeout_seconds:g}'
          ' s; start it with `worker_binary --port=PORT` (see README).'
      ) from None
  return channel


def _executor_factory(stub, default_num_clients: int = 0):
  def stack_fn(cardinalities):
    cardinalities.setdefault(tff.CLIENTS, default_num_clients)
    executor = value_transfer.RemoteExecutor(stub)
    executor.set_cardinalities(cardinalities)
    return executor

  return python_executor_stacks.ResourceManagingExecutorFactory(
      executor_stack_fn=stack_fn
  )


def _context_settings(stub) -> dict[str, Any]:
  """The executors, compiler and argument/result transforms of a context."""
  return dict(
      executor_fn=_executor_factory(stub),
      compiler_fn=compiler.desugar_and_transform_to_native,
      transform_args=tensorflow_computation.transform_args,
      transform_result=tensorflow_computation.transform_result,
  )


def _sync_context(stub):
  return sync_execution_context.SyncExecutionContext(**_context_settings(stub))


@contextlib.contextmanager
def local_runtime(
    max_concurrent_clients: Optional[int] = None,
    max_clients_per_call: Optional[int] = None,
    keep_state_on_worker: bool = False,
) -> Iterator[str]:
  """Runs TFF computations on one local worker for the duration of the block.

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
      `WorkerUnavailableError` instead of TFF's endless retries.
    keep_state_on_worker: Whether `next` of a learning (or iterative)
      process leaves the new server state on the worker, returning a
      `worker_state.StateOnWorker` handle in its place, which the next call
      takes by reference (`experiment_driver.worker_state`; the training
      loop's setting). `worker_state.fetch` turns it into a Python value.
      Computations whose cohort is split over slices fetch it first. With
      it, each computation (also a slice's) is sent to the worker once and
      reused there, instead of at every call.

  Yields:
    The worker's address.

  Raises:
    ValueError: If `max_clients_per_call` is not positive.
  """
  if max_clients_per_call is not None and max_clients_per_call < 1:
    raise ValueError('max_clients_per_call must be positive, got '
                     f'{max_clients_per_call}.')
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
          max_clients_per_slice=max_clients_per_call)
    with context_stack_impl.context_stack.install(context):
      yield address
  finally:
    if stub is not None:
      stub.close()
    stop_worker(process)


def _check_worker_addresses(addresses: Sequence[str]) -> None:
  """Raises ValueError unless `addresses` are distinct `host:port` strings."""
  if not addresses:
    raise ValueError('worker addresses must not be empty; pass host:port,...')
  for address in addresses:
    host, _, port = address.rpartition(':')
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
      raise ValueError(
          f'worker address {address!r} is not of the form host:port')
  duplicated = sorted({a for a in addresses if list(addresses).count(a) > 1})
  if duplicated:
    raise ValueError(
        f'worker address {", ".join(duplicated)} is given more than once')


# Why a closed `_WorkerStub` fails its calls.
_CLOSED = 'is closed'


class _WorkerStub(remote_executor_grpc_stub.RemoteExecutorGrpcStub):
  """The gRPC stub of one worker; fails fast, naming the worker.

  TFF's stub turns a lost connection into a `RetryableError`, on which
  `AsyncExecutionContext.invoke` retries forever, and a worker that hangs
  (frozen machine, network partition) leaves a call waiting forever. Here each
  call runs as a gRPC future; while it is outstanding the worker is probed
  every `probe_interval_seconds` with a call its gRPC server answers at once
  (an unimplemented method: any answer proves the server is alive). A call
  fails with `WorkerUnavailableError` naming the worker when the connection is
  lost, the worker lost our executor (it restarted), or a probe goes
  unanswered for `probe_timeout_seconds`. From then on every call fails at
  once, and disposals are skipped (a dead worker holds nothing to free).
  """

  def __init__(self, address: str, channel: grpc.Channel,
               probe_interval_seconds: float, probe_timeout_seconds: float):
    super().__init__(channel)
    self.address = address
    self._probe_interval_seconds = probe_interval_seconds
    self._probe_timeout_seconds = probe_timeout_seconds
    self._probe_rpc = _health_probe(channel)
    self._failure: Optional[str] = None

  def _unavailable(self, reason: str) -> WorkerUnavailableError:
    self._failure = self._failure or reason
    if self._failure == _CLOSED:
      return WorkerUnavailableError(
          f'TFF worker at {self.address} {_CLOSED}: its runtime block has'
          ' ended, and values left on the worker (a worker_state.StateOnWorker)'
          ' went with it; fetch them (worker_state.fetch) inside the block')
    return WorkerUnavailableError(
        f'TFF worker at {self.address} {self._failure}; restart it and rerun'
        ' the same command to resume from the last checkpoint')

  def _check_alive(self) -> None:
    try:
      self._probe_rpc(b'', timeout=self._probe_timeout_seconds)
    except grpc.RpcError as e:
      if e.code() in (grpc.StatusCode.UNAVAILABLE,
                      grpc.StatusCode.DEADLINE_EXCEEDED):
        raise self._unavailable(
            'stopped answering (no reply to a health probe within'
            f' {self._probe_timeout_seconds:g} s)') from e

  def _call(self, rpc: grpc.UnaryUnaryMultiCallable, request: Any) -> Any:
    if self._failure is not None:
      raise self._unavailable(self._failure)
    call = rpc.future(request)
    try:
      while True:
        try:
          return call.result(timeout=self._probe_interval_seconds)
        except grpc.FutureTimeoutError:
          self._check_alive()
    except grpc.RpcError as e:
      if e.code() in executors_errors.get_grpc_retryable_error_codes():
        raise self._unavailable(
            f'failed ({e.code().name}: {e.details()})') from e
      raise
    finally:
      call.cancel()  # No-op once the call completed.

  def _dispose_call(self, rpc: grpc.UnaryUnaryMultiCallable, request: Any,
                    empty_response: Any) -> Any:
    if self._failure is not None:
      return empty_response
    try:
      return self._call(rpc, request)
    except WorkerUnavailableError:
      return empty_response

  def get_executor(self, request):
    return self._call(self._stub.GetExecutor, request)

  def create_value(self, request):
    return self._call(self._stub.CreateValue, request)

  def create_struct(self, request):
    return self._call(self._stub.CreateStruct, request)

  def create_call(self, request):
    return self._call(self._stub.CreateCall, request)

  def create_selection(self, request):
    return self._call(self._stub.CreateSelection, request)

  def compute(self, request):
    return self._call(self._stub.Compute, request)

  def dispose(self, request):
    return self._dispose_call(self._stub.Dispose, request,
                              executor_pb2.DisposeResponse())

  def dispose_executor(self, request):
    return self._dispose_call(self._stub.DisposeExecutor, request,
                              executor_pb2.DisposeExecutorResponse())

  def close(self) -> None:
    """Cancels the calls in flight and closes the channel; later calls fail
    with a `WorkerUnavailableError` saying so."""
    self._failure = self._failure or _CLOSED
    self._channel.close()


class _WorkerContext(context_base.AsyncContext):
  """One worker's `AsyncExecutionContext`, run on a thread of its own.

  TFF's `RemoteExecutor` makes blocking gRPC calls inside its coroutines, so
  contexts sharing an event loop would run their workers one after the
  other; each worker gets its own event-loop thread so all compute at once.
  With `keep_state_on_worker`, a `worker_state.StateKeepingContext`.
  """

  def __init__(self, stub: _WorkerStub, keep_state_on_worker: bool = False):
    self.stub = stub
    self._thread = async_utils.AsyncThreadRunner()
    if keep_state_on_worker:
      self._context = worker_state.StateKeepingContext(
          self._thread, **_context_settings(stub))
    else:
      self._context = async_execution_context.AsyncExecutionContext(
          **_context_settings(stub))

  async def invoke(self, comp: Any, arg: Any) -> Any:
    return await self._thread.await_coro_and_return_result(
        self._context.invoke(comp, arg))


class _CohortSplittingContext(context_base.SyncContext):
  """Runs each computation on all workers, one part of the cohort on each.

  As TFF's `MergeableCompExecutionContext` (same compiler, same split of the
  arguments): a computation is compiled to `MergeableCompForm`; its
  CLIENTS-placed arguments are cut into one contiguous slice per worker (the
  first `M mod K` of the `K` workers take `ceil(M/K)` of the `M` clients, the
  others `floor(M/K)`; with fewer clients than workers, one client per
  worker); each worker runs `up_to_merge` on its slice, the partial
  aggregates are merged, and `after_merge` runs on each slice. Unlike it, the
  partial aggregates are merged and the per-slice results concatenated in
  slice order, not in the order the workers finish: client-placed results
  (per-client accuracies, stateful clients' new states) stay aligned with the
  clients given, and merging is deterministic; the partial aggregates are
  merged in one call on the first worker (TFF makes one call, with two
  aggregates up and one back, per merge); a result without client values
  (a learning process's `next`) is finished in that same call, with the
  first client of the first slice only (after the merge nothing is
  aggregated, so such a result cannot depend on the clients' data): at 200
  EMNIST CNN clients in slices of 50, merging and finishing took 0.3-0.4 s
  instead of 0.75 s; and a computation that has no `MergeableCompForm` (one
  aggregation depending on another) runs whole on the first worker instead
  of failing.

  With `max_clients_per_slice`, a cohort is cut into more slices when needed
  so that none holds more than that many clients; slice `i` runs on worker
  `i mod K`, and each worker runs its slices one after the other. A
  computation whose arguments make a single slice (one worker, a cohort
  within the cap) runs whole on that worker, unsplit. A worker
  holds every client's intermediate values (model updates, ...) of the
  computation it runs at once, so this bounds a worker's memory whatever the
  cohort size.
  """

  def __init__(self, workers: Sequence[_WorkerContext],
               max_clients_per_slice: Optional[int] = None):
    if max_clients_per_slice is not None and max_clients_per_slice < 1:
      raise ValueError('max_clients_per_slice must be positive, got '
                       f'{max_clients_per_slice}.')
    self._workers = list(workers)
    self._max_clients_per_slice = max_clients_per_slice
    self._compiler = compiler_pipeline.CompilerPipeline(
        mergeable_comp_compiler.compile_to_mergeable_comp_form)
    self._unsplittable = set()
    # (form, number of partial aggregates, finish) -> merging computation.
    self._merge_computations = {}
    self._event_loop = async_utils.AsyncThreadRunner()

  def invoke(self, comp: Any, arg: Any) -> Any:
    # One slice: the whole computation on the one worker. Splitting would
    # only add round trips through this process (partial aggregates out,
    # merged aggregates and the state back in): ~20 % of a 50-client EMNIST
    # CNN round, measured with `bench/`.
    num_slices = self._num_slices(arg, comp.type_signature.parameter)
    if num_slices > 1 and comp not in self._unsplittable:
      try:
        form = self._compiler.compile(comp)
      except ValueError as e:
        logging.warning(
            'Running computation %s on %s alone: it cannot be split over'
            ' workers (%s).', comp.type_signature,
            self._workers[0].stub.address, str(e)[:200])
        self._unsplittable.add(comp)
      else:
        # A state left on a worker is fetched once, not by each slice.
        result = self._event_loop.run_coro_and_return_result(
            self._invoke(form, worker_state.fetch(arg), num_slices))
        return type_conversions.type_to_py_container(
            result, form.after_merge.type_signature.result)
    return self._event_loop.run_coro_and_return_result(
        self._workers[0].invoke(comp, arg))

  def _num_slices(self, arg: Any, arg_type: tff.Type) -> int:
    """One slice per worker, more if a slice would exceed the client cap."""
    num_slices = len(self._workers)
    if arg is not None and self._max_clients_per_slice is not None:
      num_clients = cardinalities_utils.infer_cardinalities(
          arg, arg_type).get(tff.CLIENTS, 0)
      num_slices = max(num_slices,
                       -(-num_clients // self._max_clients_per_slice))
    return num_slices

  async def _map_slices(self, fn: Callable[[_WorkerContext, Any], Any],
                        slices: Sequence[Any]) -> list[Any]:
    """`fn(worker, slice)` for each slice, results in slice order.

    Slice `i` runs on worker `i mod K`; a worker runs its slices one after
    the other, the workers at the same time.
    """
    num_workers = min(len(self._workers), len(slices))

    async def run_on_worker(w):
      return [(i, await fn(self._workers[w], slices[i]))
              for i in range(w, len(slices), num_workers)]

    per_worker = await asyncio.gather(
        *[run_on_worker(w) for w in range(num_workers)])
    return [result for _, result in sorted(
        (pair for pairs in per_worker for pair in pairs),
        key=lambda pair: pair[0])]

  async def _invoke(
      self, form: mergeable_comp_execution_context.MergeableCompForm,
      arg: Any, num_slices: int) -> Any:
    arg_type = form.up_to_merge.type_signature.parameter
    if arg is None:
      slices = [None] * num_slices
    else:
      slices = _MergeableArg(arg, arg_type, num_slices).value()
    partial_aggregates = await self._map_slices(
        lambda worker, arg_slice: worker.invoke(form.up_to_merge, arg_slice),
        slices)
    result_type = form.after_merge.type_signature.result
    if type_analysis.contains_only(
        result_type,
        lambda t: not isinstance(t, tff.FederatedType) or t.all_equal):
      # A result without client values: after_merge cannot depend on the
      # clients' data (it aggregates nothing), so it gets one client of
      # them, in the same call as the merges.
      finish = self._merging_computation(form, len(partial_aggregates),
                                         finish=True)
      leading = [] if arg is None else [
          _first_client_only(slices[0], arg_type)]
      return await self._workers[0].invoke(
          finish, structure.Struct.unnamed(*leading, *partial_aggregates))
    merged = await self._workers[0].invoke(
        self._merging_computation(form, len(partial_aggregates),
                                  finish=False),
        structure.Struct.unnamed(*partial_aggregates))

    def after_merge(worker, arg_slice):
      return worker.invoke(
          form.after_merge, merged if arg_slice is None else
          structure.Struct.unnamed(arg_slice, merged))

    results = await self._map_slices(after_merge, slices)
    return _join_result_slices(results, result_type)

  def _merging_computation(
      self, form: mergeable_comp_execution_context.MergeableCompForm,
      num_partials: int, finish: bool) -> tff.Computation:
    """The partial aggregates merged in one computation, built once.

    `finish=False`: `<a_1, ..., a_K> -> merge(...merge(merge(a_1, a_2),
    a_3)..., a_K)`, one call instead of TFF's `K - 1`, each of which sent two
    model-sized aggregates to the worker and one back. `finish=True`: then
    `after_merge` on the merged aggregate in the same computation,
    `<[original_arg,] a_1, ..., a_K> -> after_merge([original_arg,] merged)`.
    Each partial aggregate is a parameter of its own, so that each is sent to
    the worker as a value of its own (one message holding all of them was
    several times slower to send).
    """
    key = (form, num_partials, finish)
    if key not in self._merge_computations:
      arg_type = form.up_to_merge.type_signature.parameter
      leading = [arg_type] if finish and arg_type is not None else []
      partial_type = form.merge.type_signature.parameter[0]

      @tff.federated_computation(tff.StructType(
          [(None, t) for t in leading + [partial_type] * num_partials]))
      def merging(arg):
        merged = arg[len(leading)]
        for i in range(len(leading) + 1, len(leading) + num_partials):
          merged = form.merge(merged, arg[i])
        if not finish:
          return merged
        merged_at_server = tff.federated_value(merged, tff.SERVER)
        if leading:
          return form.after_merge(arg[0], merged_at_server)
        return form.after_merge(merged_at_server)

      self._merge_computations[key] = merging
    return self._merge_computations[key]


def _first_client_only(value: Any, type_spec: tff.Type) -> Any:
  """`value` with each CLIENTS-placed part cut to its first client."""
  if isinstance(type_spec, tff.FederatedType):
    if type_spec.placement is tff.CLIENTS and not type_spec.all_equal:
      return list(value)[:1]
    return value
  if isinstance(type_spec, tff.StructType):
    elements = structure.from_container(value)
    return structure.Struct([
        (name, _first_client_only(element, element_type))
        for (name, element), (_, element_type) in zip(
            structure.iter_elements(elements),
            structure.iter_elements(type_spec))
    ])
  return value


@contextlib.contextmanager
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
    keep_state_on_worker: As for `local_runtime`; the state stays on the
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
        [_WorkerContext(s, keep_state_on_worker) for s in stubs])
    with context_stack_impl.context_stack.install(context):
      yield
  finally:
    for stub in stubs:
      stub.close()
