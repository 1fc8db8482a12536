"""FedOpt and FedSGD (Algorithm 1 of Charles et al. 2021, SPEC.md §1).

FedOpt: each client runs E epochs of `ClientOpt` from the server model x and
sends `Δ_k = x_k − x`; the server forms the (example-weighted or uniform) mean
`Δ` through `model_aggregator` and applies `ServerOpt(x, η_s, −Δ)`. With
server SGD at rate 1 this is FedAvg; with SGD+momentum, Adagrad, Adam, LARS or
LAMB it is FedAvgM, FedAdagrad, FedAdam, FedLARS, FedLamb.

FedSGD: each client takes one full-batch gradient at x (client rate 1); the
server applies `ServerOpt` to their mean.

Both are TFF's own learning processes (`tff.learning.algorithms`), with the
paper's aggregation (adaptive clipping etc., `large_cohort.aggregation`)
plugged into the aggregator slot.
"""

from collections.abc import Callable
from typing import Optional, Union

import tensorflow_federated as tff

ModelFn = Callable[[], tff.learning.models.VariableModel]
AggregationFactory = Union[tff.aggregators.WeightedAggregationFactory,
                           tff.aggregators.UnweightedAggregationFactory]


def build_fedopt(
    model_fn: ModelFn,
    client_optimizer: tff.learning.optimizers.Optimizer,
    server_optimizer: tff.learning.optimizers.Optimizer,
    *,
    uniform_weighting: bool = False,
    model_aggregator: Optional[AggregationFactory] = None,
) -> tff.learning.templates.LearningProcess:
  """Builds FedOpt (Algorithm 1) as a TFF learning process.

  Args:
    model_fn: A no-arg function returning a `tff.learning.models.VariableModel`.
    client_optimizer: The client optimizer (`ClientOpt`, rate η_c).
    server_optimizer: The server optimizer (`ServerOpt`, rate η_s).
    uniform_weighting: Weight clients equally instead of by example count.
    model_aggregator: The factory aggregating the client updates (weighted
      unless `uniform_weighting`); TFF's mean when `None`.
  """
  if uniform_weighting:
    return tff.learning.algorithms.build_unweighted_fed_avg(
        model_fn,
        client_optimizer_fn=client_optimizer,
        server_optimizer_fn=server_optimizer,
        model_aggregator=model_aggregator,
    )
  return tff.learning.algorithms.build_weighted_fed_avg(
      model_fn,
      client_optimizer_fn=client_optimizer,
      server_optimizer_fn=server_optimizer,
      model_aggregator=model_aggregator,
  )


def build_fedsgd(
    model_fn: ModelFn,
    server_optimizer: tff.learning.optimizers.Optimizer,
    *,
    model_aggregator: Optional[tff.aggregators.WeightedAggregationFactory] = None,
) -> tff.learning.templates.LearningProcess:
  """Builds FedSGD: one full-batch gradient per client (η_c = 1).

  The client gradient is the example-weighted mean of its batch gradients,
  i.e. the gradient of its whole local loss, whatever the batch size.

  Args:
    model_fn: A no-arg function returning a `tff.learning.models.VariableModel`.
    server_optimizer: The server optimizer applied to the mean gradient.
    model_aggregator: A weighted factory for the client gradients.
  """
  return tff.learning.algorithms.build_fed_sgd(
      model_fn,
      server_optimizer_fn=server_optimizer,
      model_aggregator=model_aggregator,
  )
