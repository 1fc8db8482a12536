"""Keeps a learning process's server state on its worker between rounds.

A training loop calls `state = process.next(state, data).state` round after
round, and TFF's execution context moves the whole server state both ways
in every call: serialized, sent to the worker and parsed there, then
computed, sent back and deserialized, although the loop only passes it into
the next call. For the 16 MB Stack Overflow LSTM that was about 0.1 s of a
round's fixed cost (driver-side timers of each RPC).

`StateKeepingContext` is TFF's `AsyncExecutionContext` with two changes.
For a state-passing computation, one whose first parameter and first result
have the same type placed at `SERVER` (`next` of an iterative or learning
process), the first element of its result is left on the worker and
returned as a `StateOnWorker` handle, and only the other elements (the
round's metrics, client states) are computed and sent back. And every
computation, state-passing or not, is sent to each executor once (0.84 MB
for the LSTM's `next`) and called there by reference in later calls: the
worker keeps what it built for it (its TensorFlow graphs and sessions)
instead of building it again at every call.

A handle given back to a state-passing computation on the executor it lives
on is passed by reference; on any other executor (another cohort size,
another worker) it is fetched and sent as a value, as any state would be,
and so it is for every other computation (e.g. `get_model_weights`, which
takes the unplaced state). `fetch` turns handles into Python values, as the
training loop does before writing a checkpoint. A handle lives as long as
its worker: fetch what is needed before the runtime ends.

Measured side by side in one process (the bench's rounds, `bench.tff_rounds`,
on one worker through a context without and one with this change; fastest
of 10 CNN and 5 LSTM rounds), the ratio to the limit at 10 clients: EMNIST
CNN full round 1.38 -> 1.26, FedAvg 1.22 -> 1.12; Stack Overflow LSTM full
round 1.27 -> 1.15, FedAvg 1.21 -> 1.07. Sending the other computations once
too (a cohort's slices, `up_to_merge` and the merge of
`runtime._CohortSplittingContext`, which had been sent at every call), the
full round's ratio on the EMNIST CNN went from 1.21 to 1.10 at 100 clients
in 4 slices of 25 (fastest of 5) and from 1.10 to 1.07 at 200 clients in 4
slices of 50 (fastest of 4), side by side on two workers.
"""

from collections.abc import Callable
from typing import Any, Optional

import tensorflow_federated as tff
import tree
from fl_common.tff_private import async_utils
from fl_common.tff_private import structure
from fl_common.tff_private import async_execution_context
from fl_common.tff_private import executor_base
from fl_common.tff_private import executor_value_base
from fl_common.tff_private import ingestable_base
from fl_common.tff_private import remote_executor
from fl_common.tff_private import type_conversions


class StateOnWorker(ingestable_base.Ingestable):
  """A server state that a state-passing computation left on its worker."""

  def __init__(self, value: remote_executor.RemoteValue,
               executor: executor_base.Executor, type_spec: tff.Type,
               runner: async_utils.AsyncThreadRunner,
               transform_result: Optional[Callable[[Any], Any]]):
    self._value = value
    self._executor = executor
    self._type_spec = type_spec
    self._runner = runner
    self._transform_result = transform_result

  @property
  def type_signature(self) -> tff.Type:
    return self._type_spec

  async def _compute(self) -> Any:
    return await self._value.compute()

  async def ingest(self, executor: executor_base.Executor) -> Any:
    """The value by reference on its own executor, else sent as a value."""
    if executor is self._executor:
      return self._value
    return await executor.create_value(await self._compute(), self._type_spec)

  async def fetch_async(self) -> Any:
    """The state as a Python value, as TFF's context would have returned it."""
    return _python_value(await self._compute(), self._type_spec,
                         self._transform_result)

  def fetch(self) -> Any:
    """`fetch_async`, from any thread but that of the worker's event loop."""
    return self._runner.run_coro_and_return_result(self.fetch_async())


def _map_states(value: Any, fn: Callable[[StateOnWorker], Any]) -> Any:
  """`value` with `fn(s)` for each `StateOnWorker` `s` in it: at its top
  level, or as an element of a list, tuple (named or not), dict or
  `tff.structure.Struct`."""
  if isinstance(value, StateOnWorker):
    return fn(value)
  if isinstance(value, structure.Struct):
    return structure.Struct([(name, _map_states(element, fn)) for name, element
                             in structure.iter_elements(value)])
  if isinstance(value, dict):
    return type(value)((k, _map_states(v, fn)) for k, v in value.items())
  if isinstance(value, tuple) and hasattr(value, '_fields'):
    return type(value)(*(_map_states(v, fn) for v in value))
  if isinstance(value, (list, tuple)):
    return type(value)(_map_states(v, fn) for v in value)
  return value


def fetch(value: Any) -> Any:
  """`value` with each `StateOnWorker` in it (as `_map_states` finds them)
  fetched as a Python value."""
  return _map_states(value, lambda state: state.fetch())


async def _fetch_async(value: Any) -> Any:
  """`fetch`, on the worker's event loop."""
  states = []
  _map_states(value, states.append)
  fetched = {id(state): await state.fetch_async() for state in states}
  return _map_states(value, lambda state: fetched[id(state)])


def passes_state(type_signature: tff.FunctionType) -> bool:
  """Whether a computation takes a server state first and returns the next
  one first (`<S@SERVER, ...> -> <S@SERVER, ...>`)."""
  parameter = type_signature.parameter
  result = type_signature.result
  if not (isinstance(parameter, tff.StructType) and
          isinstance(result, tff.StructType) and len(parameter) and
          len(result) > 1):
    return False
  state_type = parameter[0]
  return (isinstance(state_type, tff.FederatedType) and
          state_type.placement is tff.SERVER and
          result[0].is_equivalent_to(state_type))


def _python_value(value: Any, type_spec: tff.Type,
                  transform_result: Optional[Callable[[Any], Any]]) -> Any:
  """A computed `value` in `type_spec`'s Python containers, through the
  context's `transform_result`."""
  value = type_conversions.type_to_py_container(value, type_spec)
  if transform_result is not None:
    value = transform_result(value)
  return value


def _python_container(elements: list[Any], type_spec: tff.StructType) -> Any:
  """`elements`, already Python values, in `type_spec`'s container."""
  names = structure.name_list_with_nones(type_spec)
  container = getattr(type_spec, 'python_container', None)
  if container is None:
    return structure.Struct(list(zip(names, elements)))
  if all(names):
    return container(**dict(zip(names, elements)))
  return container(elements)


class StateKeepingContext(async_execution_context.AsyncExecutionContext):
  """TFF's async context that leaves a state-passing computation's new state
  on the worker and sends each computation to each executor once (module
  docstring).

  Args:
    runner: The event-loop thread this context's `invoke` runs on; handles
      are fetched through it.
    **kwargs: The arguments of `AsyncExecutionContext`; its
      `transform_result` also applies to fetched states.
  """

  def __init__(self, runner: async_utils.AsyncThreadRunner, **kwargs: Any):
    super().__init__(**kwargs)
    self._runner = runner
    # (executor, id of a compiled computation) -> the computation on the
    # worker: each is sent once per executor, not at every call.
    self._computations_on_worker = {}
    # id(computation) -> (computation, compiled): by identity, because a
    # TFF computation's hash serializes its whole proto (the compiler's
    # cache and a dict keyed by it paid that twice a round, ~1 ms for a
    # learning process's `next`). The computation is held, so its id is not
    # reused.
    self._compiled = {}

  def _compile(self, comp: tff.Computation) -> tff.Computation:
    held = self._compiled.get(id(comp))
    if held is None or held[0] is not comp:
      held = (comp, self._compiler_pipeline.compile(comp))
      self._compiled[id(comp)] = held
    return held[1]

  def _transformed_arg(self, arg: Any) -> Any:
    """`arg` through `transform_args`, element by element (it does not take
    a `tff.structure.Struct`; `AsyncExecutionContext.invoke` does the same)."""
    if self._transform_args is None:
      return arg

    def transform(value):
      return self._transform_args(tree.traverse(
          lambda v: structure.to_odict_or_tuple(v)
          if isinstance(v, structure.Struct) else None, value))

    if isinstance(arg, structure.Struct):
      return structure.Struct([(name, transform(element)) for name, element
                               in structure.iter_elements(arg)])
    return transform(arg)

  async def _computation_on_worker(
      self, executor: executor_base.Executor,
      compiled: tff.Computation) -> executor_value_base.ExecutorValue:
    """`compiled` on `executor`'s worker, sent there on its first call."""
    key = (executor, id(compiled))  # `compiled` is held by `_compiled`.
    comp_value = self._computations_on_worker.get(key)
    if comp_value is None:
      comp_value = await executor.create_value(compiled,
                                               compiled.type_signature)
      self._computations_on_worker[key] = comp_value
    return comp_value

  async def invoke(self, comp: Any, arg: Any) -> Any:
    keeps_state = arg is not None and passes_state(comp.type_signature)
    if not keeps_state:
      # Only `next` takes a state by reference; e.g. `get_model_weights`
      # takes the unplaced state.
      arg = await _fetch_async(arg)
    result_type = comp.type_signature.result
    compiled = self._compile(comp)
    parameter_type = compiled.type_signature.parameter
    cardinalities = {}
    if arg is not None:
      arg = self._transformed_arg(arg)
      cardinalities = self._cardinality_inference_fn(arg, parameter_type)
    with self._reset_factory_on_error(self._executor_factory,
                                      cardinalities) as executor:
      arg_value = None
      if arg is not None:
        arg_value = await async_execution_context._ingest(  # pylint: disable=protected-access
            executor, arg, parameter_type)
      result = await executor.create_call(
          await self._computation_on_worker(executor, compiled), arg_value)
      if not keeps_state:
        return _python_value(await result.compute(), result_type,
                             self._transform_result)
      state = StateOnWorker(await executor.create_selection(result, 0),
                            executor, result_type[0], self._runner,
                            self._transform_result)
      elements = [state]
      for index in range(1, len(result_type)):
        element = await executor.create_selection(result, index)
        elements.append(_python_value(await element.compute(),
                                      result_type[index],
                                      self._transform_result))
      return _python_container(elements, result_type)
