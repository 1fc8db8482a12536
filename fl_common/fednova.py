"""FedNova's normalized averaging as a TFF aggregation factory.

FedNova (Wang et al. 2020, "Tackling the Objective Inconsistency Problem in
Heterogeneous Federated Optimization", eq. (6)-(7)); in GeL's notation
(Boukhari et al. 2024, Appendix C.2): a client whose accumulated update is
`Delta_i = -eta_l G_i a_i` (a linear combination of its local gradients with
coefficient vector `a_i`) is normalized by `||a_i||_1`, and the server forms

    Delta = tau_eff * sum_i p_i Delta_i / ||a_i||_1,
    tau_eff = sum_i p_i ||a_i||_1,

with `p_i` the client weights normalized to sum to one. FedNova + GeL uses
Lemma 1's vector `a_i = [1 - alpha^(tau'+tau_i), ..., 1 - alpha^(tau'+1)] /
(1 - alpha)`, which is computed by the client (`gel_tff.client_work`).

Design: the normalization is an aggregator (the slot that sees all clients'
updates and weights at once), not a finalizer. Each client sends its model
delta together with its scalar `||a_i||_1` (`FedNovaClientUpdate`); the factory
averages the normalized deltas with an inner weighted factory (TFF's mean by
default, or e.g. a clipping mean) and the normalizers with TFF's mean, and
multiplies the two at the server. The output has the model delta's type, so
`tff.learning.templates.build_apply_optimizer_finalizer` applies it.
"""

import collections
from typing import Any, NamedTuple, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff


class FedNovaClientUpdate(NamedTuple):
  """What a FedNova client sends: its model delta and `||a_i||_1`."""

  model_delta: Any
  normalizer: Any


def fednova_update_type(model_delta_type: tff.Type) -> tff.StructType:
  """The TFF type of a `FedNovaClientUpdate` for a model delta type."""
  return tff.StructWithPythonType(
      [('model_delta', model_delta_type),
       ('normalizer', tff.TensorType(np.float32))],
      FedNovaClientUpdate,
  )


class FedNovaAggregationFactory(tff.aggregators.WeightedAggregationFactory):
  """Weighted FedNova aggregation of `FedNovaClientUpdate`s.

  The created process maps client values of type
  `fednova_update_type(delta_type)` and float32 weights to the server value
  `tau_eff * mean_p(Delta_i / ||a_i||_1)` of type `delta_type`, where
  `mean_p` is the inner factory's weighted mean. A client with
  `||a_i||_1 = 0` (no local step) contributes a zero normalized delta.

  Measurements: the inner aggregator's under `normalized_update`,
  `effective_steps` (= `tau_eff`), and `update_norm`, the global L2 norm of
  the returned `Delta` (the server's step; a `diagnostics_factory` inside
  measures the mean normalized delta before the `tau_eff` scaling).
  """

  def __init__(
      self,
      inner_factory: Optional[
          tff.aggregators.WeightedAggregationFactory] = None,
  ):
    """Initializes the factory.

    Args:
      inner_factory: The weighted factory averaging the normalized deltas;
        `tff.aggregators.MeanFactory()` when `None`.
    """
    if inner_factory is None:
      inner_factory = tff.aggregators.MeanFactory()
    if not isinstance(inner_factory,
                      tff.aggregators.WeightedAggregationFactory):
      raise TypeError(
          'inner_factory must be a tff.aggregators.WeightedAggregationFactory,'
          f' got {type(inner_factory).__name__}.')
    self._inner_factory = inner_factory

  def create(self, value_type: tff.Type,
             weight_type: tff.Type) -> tff.templates.AggregationProcess:
    if (not isinstance(value_type, tff.StructType) or
        tff.structure.name_list(value_type) !=
        list(FedNovaClientUpdate._fields)):
      raise ValueError(
          'FedNova aggregates FedNovaClientUpdate(model_delta, normalizer)'
          f' values, got value_type {value_type}.')
    delta_type = value_type.model_delta
    normalizer_type = value_type.normalizer
    if normalizer_type != tff.TensorType(np.float32):
      raise ValueError(
          f'The normalizer must be a float32 scalar, got {normalizer_type}.')
    delta_process = self._inner_factory.create(delta_type, weight_type)
    normalizer_process = tff.aggregators.MeanFactory().create(
        normalizer_type, weight_type)

    @tff.tensorflow.computation(value_type)
    def normalize(client_update):
      return tf.nest.map_structure(
          lambda d: tf.math.divide_no_nan(d, client_update.normalizer),
          client_update.model_delta)

    @tff.tensorflow.computation(delta_process.next.type_signature.result
                                .result.member, normalizer_type)
    def scale(mean_normalized_delta, effective_steps):
      delta = tf.nest.map_structure(lambda d: d * effective_steps,
                                    mean_normalized_delta)
      return delta, tf.linalg.global_norm(tf.nest.flatten(delta))

    @tff.federated_computation()
    def init_fn():
      return tff.federated_zip(collections.OrderedDict(
          normalized_update=delta_process.initialize(),
          effective_steps=normalizer_process.initialize()))

    @tff.federated_computation(
        init_fn.type_signature.result,
        tff.FederatedType(value_type, tff.CLIENTS),
        tff.FederatedType(weight_type, tff.CLIENTS),
    )
    def next_fn(state, value, weight):
      delta_output = delta_process.next(
          state['normalized_update'], tff.federated_map(normalize, value),
          weight)
      normalizer_output = normalizer_process.next(
          state['effective_steps'], value.normalizer, weight)
      aggregate, update_norm = tff.federated_map(
          scale, (delta_output.result, normalizer_output.result))
      new_state = tff.federated_zip(collections.OrderedDict(
          normalized_update=delta_output.state,
          effective_steps=normalizer_output.state))
      measurements = tff.federated_zip(collections.OrderedDict(
          normalized_update=delta_output.measurements,
          effective_steps=normalizer_output.result,
          update_norm=update_norm))
      return tff.templates.MeasuredProcessOutput(new_state, aggregate,
                                                 measurements)

    return tff.templates.AggregationProcess(init_fn, next_fn)
