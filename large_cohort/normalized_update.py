"""Normalized FedAvg (Charles et al. 2021, Section 5.4).

The server steps along the unit-norm pseudo-gradient:
`x ← x − η_s·Δ/‖Δ‖₂`, where `‖Δ‖₂` is the global L2 norm over all model
variables. No hyperparameter is added to FedAvg. The normalization is an
aggregator of the library (`fl_common.normalized_update`, which any family
can use); `build_normalized_fed_avg` is TFF's FedAvg with it and server SGD.
"""

from collections.abc import Callable
from typing import Optional

import tensorflow_federated as tff

from fl_common import aggregator_wrappers
from fl_common.normalized_update import normalized_update_factory

__all__ = ['build_normalized_fed_avg', 'normalized_update_factory']


def build_normalized_fed_avg(
    model_fn: Callable[[], tff.learning.models.VariableModel],
    *,
    client_optimizer: tff.learning.optimizers.Optimizer,
    server_learning_rate: float = 1.0,
    model_aggregator: Optional[aggregator_wrappers.AggregationFactory] = None,
) -> tff.learning.templates.LearningProcess:
  """Builds normalized FedAvg (Section 5.4): `x ← x − η_s·Δ/‖Δ‖₂`.

  TFF's FedAvg (`tff.learning.algorithms.build_weighted_fed_avg`, or the
  unweighted one for an unweighted aggregator) with server SGD at rate
  `server_learning_rate` and `normalized_update_factory(model_aggregator)` in
  the aggregator slot. The paper reuses FedAvg's tuned rates unchanged.

  Args:
    model_fn: A no-arg function returning a `tff.learning.models.VariableModel`.
    client_optimizer: The client optimizer (SGD at η_c in the paper).
    server_learning_rate: η_s, the length of every server step (> 0).
    model_aggregator: The factory aggregating client updates before
      normalization (e.g. adaptive clipping); `tff.aggregators.MeanFactory()`
      (example-weighted mean) when `None`.

  Raises:
    ValueError: If `server_learning_rate` is not positive.
  """
  if server_learning_rate <= 0.0:
    raise ValueError(
        f'server_learning_rate must be > 0, got {server_learning_rate}.')
  aggregator = normalized_update_factory(
      model_aggregator or tff.aggregators.MeanFactory())
  server_optimizer = tff.learning.optimizers.build_sgdm(server_learning_rate)
  if isinstance(aggregator, tff.aggregators.WeightedAggregationFactory):
    return tff.learning.algorithms.build_weighted_fed_avg(
        model_fn, client_optimizer, server_optimizer,
        model_aggregator=aggregator)
  return tff.learning.algorithms.build_unweighted_fed_avg(
      model_fn, client_optimizer, server_optimizer,
      model_aggregator=aggregator)
