"""gRPC connections to TFF workers that fail fast, naming the worker.

TFF's own stub retries a lost worker forever; `_WorkerStub` probes a worker
while a call is outstanding and turns a lost, restarted or hung worker into a
`WorkerUnavailableError`.
"""

import threading
import time
from collections.abc import Sequence
from typing import Any, Optional

import grpc
from fl_common.tff_private import executor_pb2
from fl_common.tff_private import executors_errors
from fl_common.tff_private import remote_executor_grpc_stub

_GRPC_MAX_MESSAGE_BYTES = 2 * 1000 * 1000 * 1000
_GRPC_OPTIONS = [
    ('grpc.max_message_length', _GRPC_MAX_MESSAGE_BYTES),
    ('grpc.max_receive_message_length', _GRPC_MAX_MESSAGE_BYTES),
    ('grpc.max_send_message_length', _GRPC_MAX_MESSAGE_BYTES),
]
# Sets the worker's parent-death signal (`PR_SET_PDEATHSIG`, kept across


class WorkerUnavailableError(RuntimeError):
  """A TFF worker could not be reached, failed or stopped answering."""


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
  (frozen machine, network partition) leaves a call waiting forever. Here
  while a call is outstanding, a watchdog thread (one per stub) probes the
  worker every `probe_interval_seconds` with a call its gRPC server answers
  at once (an unimplemented method: any answer proves the server is alive).
  A call fails with `WorkerUnavailableError` naming the worker when the
  connection is lost, the worker lost our executor (it restarted), or a
  probe goes unanswered for `probe_timeout_seconds` (the watchdog then
  closes the channel, which ends the calls in flight). From then on every
  call fails at once, and disposals are skipped (a dead worker holds nothing
  to free).

  Calls are blocking gRPC calls, not futures: a future starts a thread
  (gRPC's channel spin thread) whenever none of the channel's calls is in
  flight, i.e. for nearly every call of a round's dozen, which took ~3 ms of
  a 15 ms round of a small model (side by side in one process).
  """

  def __init__(self, address: str, channel: grpc.Channel,
               probe_interval_seconds: float, probe_timeout_seconds: float):
    super().__init__(channel)
    self.address = address
    self._probe_interval_seconds = probe_interval_seconds
    self._probe_timeout_seconds = probe_timeout_seconds
    self._probe_rpc = _health_probe(channel)
    self._failure: Optional[str] = None
    self._lock = threading.Lock()
    self._in_flight: dict[object, float] = {}  # call -> time.monotonic()
    self._stop = threading.Event()
    self._watchdog: Optional[threading.Thread] = None

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

  def _watch(self) -> None:
    """The watchdog: probes the worker while a call has been in flight for
    `probe_interval_seconds`; closes the channel if it does not answer."""
    while not self._stop.wait(self._probe_interval_seconds):
      with self._lock:
        oldest = min(self._in_flight.values(), default=None)
      if (oldest is None or
          time.monotonic() - oldest < self._probe_interval_seconds):
        continue
      try:
        self._check_alive()
      except WorkerUnavailableError:  # `_failure` says why.
        self._channel.close()
        return
      except ValueError:  # The channel was closed meanwhile (close()).
        return

  def _call(self, rpc: grpc.UnaryUnaryMultiCallable, request: Any) -> Any:
    if self._failure is not None:
      raise self._unavailable(self._failure)
    token = object()
    with self._lock:
      self._in_flight[token] = time.monotonic()
      if self._watchdog is None:
        self._watchdog = threading.Thread(
            target=self._watch, daemon=True,
            name=f'tff-worker-watchdog-{self.address}')
        self._watchdog.start()
    try:
      return rpc(request)
    except grpc.RpcError as e:
      if self._failure is not None:  # The watchdog or close() ended it.
        raise self._unavailable(self._failure) from e
      if e.code() in executors_errors.get_grpc_retryable_error_codes():
        raise self._unavailable(
            f'failed ({e.code().name}: {e.details()})') from e
      raise
    except ValueError as e:  # gRPC's "Cannot invoke RPC on closed channel!"
      if self._failure is not None:
        raise self._unavailable(self._failure) from e
      raise
    finally:
      with self._lock:
        del self._in_flight[token]

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
    self._stop.set()
    self._channel.close()

