"""Wrapping a `tff.aggregators` factory, weighted or unweighted, alike.

`diagnostics.diagnostics_factory` and `normalized_update.
normalized_update_factory` (Charles et al. 2021, SPEC.md §1) each put one
step around an inner factory's aggregation of a structure of floats and keep
the inner factory's weightedness. `wrap_factory` does what they share: it
checks the inner factory and the value type, creates the inner process, and
builds the wrapping process (the inner process's state, and a federated
`next` whose signature follows the inner one) around the `next` body a
module supplies. `wrap_server_side` is the case of a step that only
transforms the inner aggregate at the server (normalization): such a
factory says so (`server_side`), so that fused rounds
(`fl_engine.fused`), which compute the inner aggregate themselves, can
apply the step after it. `inner_next` calls the inner `next` with or without
weights, and `global_norm` is the norm both modules compute.
`AggregationFactory` is the type of an aggregator any large-cohort builder
accepts.
"""

from collections.abc import Callable
from typing import Any, Optional, Union

import tensorflow as tf
import tensorflow_federated as tff

AggregationFactory = Union[tff.aggregators.WeightedAggregationFactory,
                           tff.aggregators.UnweightedAggregationFactory]

# The federated body of the wrapping process's `next`:
# (state, value, weight or None) -> MeasuredProcessOutput.
NextImpl = Callable[[Any, Any, Optional[Any]],
                    tff.templates.MeasuredProcessOutput]

# (inner_process, value_type, weight_type or None) -> the `next` body.
BuildNextImpl = Callable[
    [tff.templates.AggregationProcess, tff.types.Type,
     Optional[tff.types.Type]], NextImpl]


def global_norm(value: Any) -> tf.Tensor:
  """Global L2 norm of a structure of float tensors, computed in float64."""
  squares = [tf.reduce_sum(tf.square(tf.cast(t, tf.float64)))
             for t in tf.nest.flatten(value)]
  return tf.sqrt(tf.add_n(squares))


def inner_next(inner_process: tff.templates.AggregationProcess, state: Any,
               value: Any,
               weight: Optional[Any]) -> tff.templates.MeasuredProcessOutput:
  """`inner_process.next`, given `weight` unless the process is unweighted."""
  if weight is None:
    return inner_process.next(state, value)
  return inner_process.next(state, value, weight)


def _build_wrapping_process(
    factory_name: str,
    inner_process: tff.templates.AggregationProcess,
    value_type: tff.types.Type,
    weight_type: Optional[tff.types.Type],
    build_next_impl: BuildNextImpl,
) -> tff.templates.AggregationProcess:
  """An `AggregationProcess` with `inner_process`'s state around `next_impl`.

  Raises:
    ValueError: If `value_type` is not a structure of floats.
  """
  if not tff.types.is_structure_of_floats(value_type):
    raise ValueError(
        f'{factory_name} needs a structure of floats, got value_type '
        f'{value_type}.')
  next_impl = build_next_impl(inner_process, value_type, weight_type)
  state_type = inner_process.initialize.type_signature.result
  value_at_clients = tff.FederatedType(value_type, tff.CLIENTS)
  if weight_type is None:

    @tff.federated_computation(state_type, value_at_clients)
    def next_fn(state, value):
      return next_impl(state, value, None)

  else:

    @tff.federated_computation(state_type, value_at_clients,
                               tff.FederatedType(weight_type, tff.CLIENTS))
    def next_fn(state, value, weight):
      return next_impl(state, value, weight)

  return tff.templates.AggregationProcess(inner_process.initialize, next_fn)


class _WeightedWrapperFactory(tff.aggregators.WeightedAggregationFactory):
  """A weighted inner factory's processes, each wrapped."""

  def __init__(self, factory_name: str,
               inner: tff.aggregators.WeightedAggregationFactory,
               build_next_impl: BuildNextImpl):
    self._factory_name = factory_name
    self._inner = inner
    self._build_next_impl = build_next_impl

  def create(self, value_type, weight_type) -> tff.templates.AggregationProcess:
    return _build_wrapping_process(
        self._factory_name, self._inner.create(value_type, weight_type),
        value_type, weight_type, self._build_next_impl)


class _UnweightedWrapperFactory(tff.aggregators.UnweightedAggregationFactory):
  """An unweighted inner factory's processes, each wrapped."""

  def __init__(self, factory_name: str,
               inner: tff.aggregators.UnweightedAggregationFactory,
               build_next_impl: BuildNextImpl):
    self._factory_name = factory_name
    self._inner = inner
    self._build_next_impl = build_next_impl

  def create(self, value_type) -> tff.templates.AggregationProcess:
    return _build_wrapping_process(
        self._factory_name, self._inner.create(value_type), value_type, None,
        self._build_next_impl)


def wrap_factory(factory_name: str, inner_factory: AggregationFactory,
                 build_next_impl: BuildNextImpl) -> AggregationFactory:
  """A factory of `inner_factory`'s weightedness whose processes wrap its own.

  Its `create` checks that the value type is a structure of floats, creates
  `inner_factory`'s process and returns a process with that process's state
  whose `next` is `build_next_impl(inner_process, value_type, weight_type)`
  (`weight_type` and the body's `weight` are `None` when unweighted).

  Args:
    factory_name: Names the wrapping factory in error messages.
    inner_factory: A weighted or unweighted `tff.aggregators` factory.
    build_next_impl: Builds the federated body of the wrapping `next`.

  Raises:
    ValueError: If `inner_factory` is not a `tff.aggregators` factory (and,
      from `create`, if the value type is not a structure of floats).
  """
  if isinstance(inner_factory, tff.aggregators.WeightedAggregationFactory):
    return _WeightedWrapperFactory(factory_name, inner_factory,
                                   build_next_impl)
  if isinstance(inner_factory, tff.aggregators.UnweightedAggregationFactory):
    return _UnweightedWrapperFactory(factory_name, inner_factory,
                                     build_next_impl)
  raise ValueError(
      'inner_factory must be a tff.aggregators.WeightedAggregationFactory or '
      f'UnweightedAggregationFactory, got {inner_factory!r}.')


# value_type -> (the inner process's output at the server -> the output).
BuildServerFn = Callable[[tff.types.Type], Callable[
    [tff.templates.MeasuredProcessOutput], tff.templates.MeasuredProcessOutput]]


def wrap_server_side(factory_name: str, inner_factory: AggregationFactory,
                     build_server_fn: BuildServerFn) -> AggregationFactory:
  """`wrap_factory` for a step on the inner process's output at the server.

  The factory's `server_side` attribute is `(inner_factory,
  build_server_fn)`: the inner factory and the step, for callers that
  compute the inner aggregate another way.
  """

  def build_next_impl(inner_process, value_type, weight_type):
    del weight_type
    server_fn = build_server_fn(value_type)

    def next_impl(state, value, weight):
      return server_fn(inner_next(inner_process, state, value, weight))

    return next_impl

  factory = wrap_factory(factory_name, inner_factory, build_next_impl)
  factory.server_side = (inner_factory, build_server_fn)
  return factory
