"""TFF execution contexts on the package's workers and devices.

`_WorkerContext` runs one worker's `AsyncExecutionContext` on a thread of its
own, `_DeviceContext` one in-process device's; `_InProcessContext` runs one
device's calls on the calling thread; `_CohortSplittingContext` spreads each
computation's cohort over workers or devices (and over slices of a bounded
size) and merges the partial aggregates.

Why one module: the four are the same TFF context put to four uses (same
compiler, argument transform and result conversion), and the splitting
context drives the others; apart, each would import the rest.

It goes below TFF's public API (through `fl_common.tff_private`; TFF 0.87
is pinned): TFF offers no public way to run a computation on executor
services the caller started and owns, nor to split a cohort over them with
results kept in client order.
"""

import asyncio
import threading
from collections.abc import Callable, Sequence
from typing import Any, Optional

from absl import logging
import numpy as np
import tensorflow_federated as tff
import tree
from fl_common.tff_private import async_utils
from fl_common.tff_private import structure
from fl_common.tff_private import compiler
from fl_common.tff_private import mergeable_comp_compiler
from fl_common.tff_private import tensorflow_computation
from fl_common.tff_private import computation_impl
from fl_common.tff_private import context_base
from fl_common.tff_private import async_execution_context
from fl_common.tff_private import compiler_pipeline
from fl_common.tff_private import mergeable_comp_execution_context
from fl_common.tff_private import sync_execution_context
from fl_common.tff_private import python_executor_stacks
from fl_common.tff_private import cardinalities_utils
from fl_common.tff_private import type_analysis
from fl_common.tff_private import type_conversions

from fl_engine import value_transfer
from fl_engine.runtime import in_process
from fl_engine.runtime import shortcuts
from fl_engine import worker_state
from fl_engine.runtime.stubs import _WorkerStub

# TFF's own split of a computation's argument into one slice of the clients
# per worker, and the inverse for its result (pinned TFF 0.87).
_MergeableArg = (
    mergeable_comp_execution_context.MergeableCompExecutionContextValue)
_join_result_slices = (
    mergeable_comp_execution_context._repackage_partitioned_values)  # pylint: disable=protected-access


# A call's CLIENTS-placed arrays (fused shards, `fl_engine.shards`) are sent
# and held on the worker at once: beyond this, the cohort is cut into more
# slices (two shards of `shards.MAX_AUTO_SHARD_BYTES`, one per core of this
# machine's workers).
MAX_BYTES_PER_SLICE = 16 << 20


def _largest_client_bytes(value: Any, type_spec: Optional[tff.Type]) -> int:
  """The most bytes of NumPy arrays that one client holds in `value`'s
  CLIENTS-placed parts (a state kept on the worker, a tf.data dataset:
  none)."""
  per_client = {}

  def add(value, type_spec):
    if type_spec is None or value is None:
      return
    if isinstance(type_spec, tff.FederatedType):
      if type_spec.placement is tff.CLIENTS and not type_spec.all_equal:
        for k, client_value in enumerate(value):
          per_client[k] = per_client.get(k, 0) + sum(
              x.nbytes for x in tree.flatten(client_value)
              if isinstance(x, np.ndarray))
      return
    if isinstance(type_spec, tff.StructType):
      try:
        elements = structure.from_container(value)
      except TypeError:
        return
      for (_, element), (_, element_type) in zip(
          structure.iter_elements(elements),
          structure.iter_elements(type_spec)):
        add(element, element_type)

  add(value, type_spec)
  return max(per_client.values(), default=0)


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



def _is_at_clients(type_spec: tff.Type) -> bool:
  return (isinstance(type_spec, tff.FederatedType) and
          type_spec.placement is tff.CLIENTS)


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

  @property
  def name(self) -> str:
    return self.stub.address

  async def invoke(self, comp: Any, arg: Any) -> Any:
    return await self._thread.await_coro_and_return_result(
        self._context.invoke(comp, arg))


class _DeviceContext(context_base.AsyncContext):
  """One device's in-process `AsyncExecutionContext`, on a thread of its
  own (as `_WorkerContext`), so that several devices compute at once."""

  def __init__(self, device: in_process.Device):
    self.device = device
    self._thread = async_utils.AsyncThreadRunner()
    self._context = async_execution_context.AsyncExecutionContext(
        **in_process.context_settings(device))

  @property
  def name(self) -> str:
    return self.device.name

  async def invoke(self, comp: Any, arg: Any) -> Any:
    return await self._thread.await_coro_and_return_result(
        self._context.invoke(comp, arg))


class _InProcessContext(context_base.SyncContext):
  """One device's in-process context, run on the calling thread.

  TFF's `AsyncExecutionContext` over `in_process.context_settings(device)`
  (the same argument transform, cardinalities, ingestion and conversion of
  results to the computation's Python containers), without two costs of
  TFF's `SyncExecutionContext` that serve remote executors and were about a
  third of a small model's planned round (synthetic_lr, 20 clients): the
  hop to an event-loop thread at
  every call, and a compiled-computation cache keyed by `hash(comp)`, which
  serializes the computation's whole proto at every call. Here each call
  runs on an event loop of the calling thread, and a computation is
  compiled once for as long as it lives (kept by identity). From a thread
  whose event loop is already running (a notebook's), a call runs on TFF's
  event-loop thread, as in TFF's context.
  """

  def __init__(self, device: in_process.Device):
    self.device = device
    settings = in_process.context_settings(device)
    self._compiler_fn = settings.pop('compiler_fn')
    # No result transform: TFF's turns eager tensors into NumPy, and every
    # result here is NumPy already (fetched from a session, or an argument
    # passed through, which `transform_args` made NumPy).
    settings['transform_result'] = None
    self._context = async_execution_context.AsyncExecutionContext(
        compiler_fn=None, **settings)
    self._compiled = in_process.IdentityCache()
    # Computation -> {argument structure: its `shortcuts.Shortcut`}.
    self._shortcuts = in_process.IdentityCache()
    self._loops = threading.local()
    self._all_loops = []  # Every thread's, to close with the context.
    self._thread = None
    self._lock = threading.Lock()

  def _compile(self, comp: tff.Computation) -> tff.Computation:
    # With `comp`'s own type: its results' Python containers (attrs
    # classes, named tuples), which TFF's context takes from `comp`.
    return computation_impl.ConcreteComputation.with_type(
        self._compiler_fn(comp), comp.type_signature)

  def invoke(self, comp: Any, arg: Any) -> Any:
    # A planned call replayed without TFF's per-call Python when the
    # argument has the structure of one recorded (`shortcuts`).
    arg_leaves = []
    recorded = None
    if shortcuts.SHORTCUTS and in_process.PLANS:
      arg_structure = shortcuts.flatten(arg, arg_leaves)
      recorded = self._shortcuts.get(comp, dict)
      shortcut = recorded.get(arg_structure)
      if shortcut is not None:
        result = shortcut(arg_leaves)
        if result is not shortcuts.MISS:
          return result
    compiled = self._compiled.get(comp, lambda: self._compile(comp))
    coro = self._context.invoke(compiled, arg)
    try:
      asyncio.get_running_loop()
    except RuntimeError:
      loop = getattr(self._loops, 'loop', None)
      if loop is None:
        loop = self._loops.loop = asyncio.new_event_loop()
        with self._lock:
          self._all_loops.append(loop)
      if recorded is None or arg_structure in recorded or len(
          recorded) >= in_process.MAX_PLANS:
        return loop.run_until_complete(coro)
      with in_process.recording_plans() as calls:
        result = loop.run_until_complete(coro)
      if calls:  # Planned (None: a plan that cannot be replayed).
        recorded[arg_structure] = shortcuts.record(self.device, arg_leaves,
                                                   calls, result)
      return result
    with self._lock:
      if self._thread is None:
        self._thread = async_utils.AsyncThreadRunner()
    return self._thread.run_coro_and_return_result(coro)

  def close(self) -> None:
    """Closes the event loops the calls ran on."""
    with self._lock:
      loops, self._all_loops = self._all_loops, []
    for loop in loops:
      loop.close()


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
  `i mod K`, and each worker runs its slices one after the other. Likewise
  with `max_bytes_per_slice`, for the NumPy arrays of the clients'
  arguments (fused shards): a slice holds as many clients as fit in it at
  the largest client's size, at least one. A
  computation whose arguments make a single slice (one worker, a cohort
  within the caps) runs whole on that worker, unsplit. A worker
  holds every client's intermediate values (model updates, ...) of the
  computation it runs at once, so this bounds a worker's memory whatever the
  cohort size.
  """

  def __init__(self, workers: Sequence[_WorkerContext],
               max_clients_per_slice: Optional[int] = None,
               max_bytes_per_slice: Optional[int] = None):
    for name, cap in (('max_clients_per_slice', max_clients_per_slice),
                      ('max_bytes_per_slice', max_bytes_per_slice)):
      if cap is not None and cap < 1:
        raise ValueError(f'{name} must be positive, got {cap}.')
    self._workers = list(workers)
    self._max_clients_per_slice = max_clients_per_slice
    self._max_bytes_per_slice = max_bytes_per_slice
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
            ' workers or devices (%s).', comp.type_signature,
            self._workers[0].name, str(e)[:200])
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
    # Only clients are sliced: an argument without any (e.g. a state kept on
    # the worker, for `get_model_weights`) is not inspected.
    if (arg is None or (self._max_clients_per_slice is None and
                        self._max_bytes_per_slice is None) or
        not type_analysis.contains(arg_type, _is_at_clients)):
      return num_slices
    num_clients = cardinalities_utils.infer_cardinalities(
        arg, arg_type).get(tff.CLIENTS, 0)
    if self._max_clients_per_slice is not None:
      num_slices = max(num_slices,
                       -(-num_clients // self._max_clients_per_slice))
    largest = (0 if self._max_bytes_per_slice is None else
               _largest_client_bytes(arg, arg_type))
    if largest:
      per_slice = max(1, self._max_bytes_per_slice // largest)
      num_slices = max(num_slices, -(-num_clients // per_slice))
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

