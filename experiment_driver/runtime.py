"""Start and stop the TFF C++ runtime this package computes on.

TFF's own `set_sync_local_cpp_execution_context` starts a `worker_binary`
subprocess that outlives Python and keeps the parent's stdout open, which
hangs pipes and CI. Here the package starts the executor service itself, so it
owns the process:

* the worker is started with `PR_SET_PDEATHSIG`, so the kernel kills it when
  the Python process dies for any reason (even `SIGKILL`);
* `local_runtime()` / `remote_runtime()` are context managers that stop it on
  exit, and an `atexit` hook stops anything still running.

Every entry point (`run_experiment.py`, the benchmarks, the test suite) goes
through this module.
"""

import atexit
import contextlib
import ctypes
import gc
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from typing import Any, Optional

import grpc
import portpicker
import tensorflow_federated as tff
from tensorflow_federated.python.core.backends.native import compiler
from tensorflow_federated.python.core.environments.tensorflow_frontend import tensorflow_computation
from tensorflow_federated.python.core.impl.context_stack import context_stack_impl
from tensorflow_federated.python.core.impl.context_stack import runtime_error_context
from tensorflow_federated.python.core.impl.execution_contexts import async_execution_context
from tensorflow_federated.python.core.impl.execution_contexts import sync_execution_context
from tensorflow_federated.python.core.impl.executor_stacks import python_executor_stacks
from tensorflow_federated.python.core.impl.executors import remote_executor
from tensorflow_federated.python.core.impl.executors import remote_executor_grpc_stub

WORKER_BINARY_PATH = os.path.join(
    os.path.dirname(tff.__file__), 'data', 'worker_binary'
)
_GRPC_MAX_MESSAGE_BYTES = 2 * 1000 * 1000 * 1000
_GRPC_OPTIONS = [
    ('grpc.max_message_length', _GRPC_MAX_MESSAGE_BYTES),
    ('grpc.max_receive_message_length', _GRPC_MAX_MESSAGE_BYTES),
    ('grpc.max_send_message_length', _GRPC_MAX_MESSAGE_BYTES),
]
_PR_SET_PDEATHSIG = 1
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
  """A TFF executor service could not be reached."""


def _die_with_parent() -> None:
  """Runs in the forked child: ask the kernel to SIGKILL it with its parent."""
  libc = ctypes.CDLL('libc.so.6', use_errno=True)
  libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def start_worker(
    port: Optional[int] = None, max_concurrent_clients: int = -1
) -> tuple[subprocess.Popen, str]:
  """Starts one `worker_binary` on localhost; returns it and its address.

  Args:
    port: The port to serve on; a free one is picked when `None`.
    max_concurrent_clients: The worker's `--max_concurrent_computation_calls`:
      how many client computations run at once (non-positive: no limit).
  """
  port = port or portpicker.pick_unused_port()
  process = subprocess.Popen(
      [
          WORKER_BINARY_PATH,
          f'--port={port}',
          f'--max_concurrent_computation_calls={max_concurrent_clients}',
      ],
      stdin=subprocess.DEVNULL,
      stdout=subprocess.DEVNULL,
      stderr=subprocess.DEVNULL,
      preexec_fn=_die_with_parent,
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


def _connect(address: str, timeout_seconds: float) -> Any:
  """Returns a ready gRPC stub for the executor service at `address`."""
  channel = grpc.insecure_channel(address, _GRPC_OPTIONS)
  stub = remote_executor_grpc_stub.RemoteExecutorGrpcStub(channel)
  deadline = time.monotonic() + timeout_seconds
  while not stub.is_ready:
    if time.monotonic() > deadline:
      raise WorkerUnavailableError(
          f'TFF worker at {address} did not answer within {timeout_seconds:g}'
          ' s; start it with `worker_binary --port=PORT` (see README).'
      )
    time.sleep(0.05)
  return stub


def _executor_factory(stub, default_num_clients: int = 0):
  def stack_fn(cardinalities):
    cardinalities.setdefault(tff.CLIENTS, default_num_clients)
    executor = remote_executor.RemoteExecutor(stub)
    executor.set_cardinalities(cardinalities)
    return executor

  return python_executor_stacks.ResourceManagingExecutorFactory(
      executor_stack_fn=stack_fn
  )


def _sync_context(stub):
  return sync_execution_context.SyncExecutionContext(
      executor_fn=_executor_factory(stub),
      compiler_fn=compiler.desugar_and_transform_to_native,
      transform_args=tensorflow_computation.transform_args,
      transform_result=tensorflow_computation.transform_result,
  )


def _async_context(stub):
  return async_execution_context.AsyncExecutionContext(
      executor_fn=_executor_factory(stub),
      compiler_fn=compiler.desugar_and_transform_to_native,
      transform_args=tensorflow_computation.transform_args,
      transform_result=tensorflow_computation.transform_result,
  )


@contextlib.contextmanager
def local_runtime(max_concurrent_clients: int = -1) -> Iterator[str]:
  """Runs TFF computations on one local worker for the duration of the block.

  Args:
    max_concurrent_clients: How many client computations the worker runs at
      once; non-positive means no limit (all cores).

  Yields:
    The worker's address.
  """
  process, address = start_worker(max_concurrent_clients=max_concurrent_clients)
  try:
    stub = _connect(address, timeout_seconds=60)
    with context_stack_impl.context_stack.install(_sync_context(stub)):
      yield address
  finally:
    stop_worker(process)


@contextlib.contextmanager
def remote_runtime(addresses: Sequence[str]) -> Iterator[None]:
  """Spreads each TFF computation over the workers at `addresses`.

  Uses TFF's mergeable-computation context: each round's cohort is split into
  one part per worker, each worker runs its part's client work and partial
  aggregation, and the parts are merged here. A worker that stops answering
  mid-run is named in a `WorkerUnavailableError`.
  """
  stubs = {address: _connect(address, timeout_seconds=30)
           for address in addresses}
  context = tff.backends.native.create_mergeable_comp_execution_context(
      [_async_context(stub) for stub in stubs.values()])
  try:
    with context_stack_impl.context_stack.install(context):
      yield
  except Exception as e:  # pylint: disable=broad-except
    lost = [address for address, stub in stubs.items() if not stub.is_ready]
    if lost:
      raise WorkerUnavailableError(
          f'TFF worker {", ".join(lost)} stopped answering'
          f' ({type(e).__name__}); restart it and rerun the same command to'
          ' resume from the last checkpoint') from e
    raise
