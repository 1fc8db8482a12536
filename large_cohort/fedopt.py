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

Client loop: both default to TFF's `DATASET_ITERATOR` loop instead of TFF's
default `DATASET_REDUCE`; the computed update is the same. Under
`dataset.reduce` the model's forward and backward `tf.function`s live in a
tf.data function, which the worker's TensorFlow neither inlines nor
optimizes: it re-instantiates them for every client (~12 % of the worker's
CPU time on the EMNIST CNN) and runs the max-pool gradient unfused. With the
iterator loop they sit in the main graph, where TFF's compiler inlines them;
the worker then spends ~35 % less CPU per client (`bench/`, ../BENCH.md).
"""

from collections.abc import Callable
from typing import Optional

import tensorflow_federated as tff

from large_cohort import aggregator_wrappers

ModelFn = Callable[[], tff.learning.models.VariableModel]
_ITERATOR_LOOP = tff.learning.LoopImplementation.DATASET_ITERATOR


def build_fedopt(
    model_fn: ModelFn,
    client_optimizer: tff.learning.optimizers.Optimizer,
    server_optimizer: tff.learning.optimizers.Optimizer,
    *,
    uniform_weighting: bool = False,
    model_aggregator: Optional[aggregator_wrappers.AggregationFactory] = None,
    loop_implementation: tff.learning.LoopImplementation = _ITERATOR_LOOP,
) -> tff.learning.templates.LearningProcess:
  """Builds FedOpt (Algorithm 1) as a TFF learning process.

  Args:
    model_fn: A no-arg function returning a `tff.learning.models.VariableModel`.
    client_optimizer: The client optimizer (`ClientOpt`, rate η_c).
    server_optimizer: The server optimizer (`ServerOpt`, rate η_s).
    uniform_weighting: Weight clients equally instead of by example count.
    model_aggregator: The factory aggregating the client updates (weighted
      unless `uniform_weighting`); TFF's mean when `None`.
    loop_implementation: TFF's client training loop; see the module
      docstring for why the default is `DATASET_ITERATOR`.
  """
  if uniform_weighting:
    return tff.learning.algorithms.build_unweighted_fed_avg(
        model_fn,
        client_optimizer_fn=client_optimizer,
        server_optimizer_fn=server_optimizer,
        model_aggregator=model_aggregator,
        loop_implementation=loop_implementation,
    )
  return tff.learning.algorithms.build_weighted_fed_avg(
      model_fn,
      client_optimizer_fn=client_optimizer,
      server_optimizer_fn=server_optimizer,
      model_aggregator=model_aggregator,
      loop_implementation=loop_implementation,
  )


def build_fedsgd(
    model_fn: ModelFn,
    server_optimizer: tff.learning.optimizers.Optimizer,
    *,
    model_aggregator: Optional[tff.aggregators.WeightedAggregationFactory] = None,
    loop_implementation: tff.learning.LoopImplementation = _ITERATOR_LOOP,
) -> tff.learning.templates.LearningProcess:
  """Builds FedSGD: one full-batch gradient per client (η_c = 1).

  The client gradient is the example-weighted mean of its batch gradients,
  i.e. the gradient of its whole local loss, whatever the batch size.

  Args:
    model_fn: A no-arg function returning a `tff.learning.models.VariableModel`.
    server_optimizer: The server optimizer applied to the mean gradient.
    model_aggregator: A weighted factory for the client gradients.
    loop_implementation: TFF's client loop over the batches (module
      docstring).
  """
  return tff.learning.algorithms.build_fed_sgd(
      model_fn,
      server_optimizer_fn=server_optimizer,
      model_aggregator=model_aggregator,
      loop_implementation=loop_implementation,
  )
