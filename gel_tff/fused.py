"""GeL's rows of Table 3 on fused cohorts: one TFF client trains a shard.

`compose_fused` builds the process that `gel_tff.gel` composes per client
(broadcast, the GeL client work, the mean or FedNova's normalized averaging,
the server optimizer), in which a TFF client stands for a shard of real
clients, trained one after the other in one TensorFlow graph
(`fl_common.fused`, which says how and why). Each client runs the client
work's own program (`gel_tff.client_work.client_program`: `local_step` on
each of its `tau_i` batches, then `guessed_update`), so its update, its weight, its
FedNova normalizer and its gradient count are those of the per-client
process; the shard sums its clients' contributions to the aggregator
(`fl_common.diagnosed_mean`, the driver's: the mean, adaptive clipping and
the paper's diagnostics; FedNova's normalized averaging around it). State
and metrics are the per-client process's (`tests/gel_tff/test_fused.py`).

The public builders are `gel_tff.gel.build_fused_gel` and
`build_fused_budgeted_baseline`.
"""

from collections.abc import Callable
from typing import Any, Optional

import tensorflow_federated as tff

from fl_common import client_program as client_program_lib
from fl_common import diagnosed_mean
from fl_common import fused
from fl_common import lanes as fl_lanes
from gel_tff import client_work as client_work_lib

ModelFn = Callable[[], tff.learning.models.VariableModel]
DiagnosedMeanFactory = fused.DiagnosedMeanFactory


def compose_fused(
    model_fn: ModelFn,
    *,
    client_learning_rate: float,
    client_momentum: float,
    expected_steps: int,
    guessed_steps: client_work_lib.GuessedSteps,
    server_optimizer: tff.learning.optimizers.Optimizer,
    proximal_strength: float,
    client_weighting: tff.learning.ClientWeighting,
    report_normalizer: bool,
    model_aggregator: Optional[fused.DiagnosedMeanFactory],
    metrics_aggregator: Optional[tff.learning.metrics.MetricsAggregatorType],
    resident_examples: Optional[Any] = None,
    lanes: int = 1,
) -> tff.learning.templates.LearningProcess:
  """One row of Table 3 on shards (arguments as `gel_tff.gel`'s `_build`;
  `resident_examples` as `fl_common.fused.build_fused_process`'s; `lanes`
  as `build_fused_gel`'s).

  `model_aggregator` is a `diagnosed_mean.diagnosed_mean_factory`, weighted
  or not (the per-client process takes the unweighted one through
  `tff.aggregators.as_weighted_aggregator`); `None` is the weighted mean
  without clipping.

  Raises:
    TypeError: If `model_aggregator` is not a diagnosed mean.
    ValueError: If an argument is out of range.
  """
  client_work_lib.validate_client_work_args(
      learning_rate=client_learning_rate, momentum=client_momentum,
      expected_steps=expected_steps, guessed_steps=guessed_steps,
      proximal_strength=proximal_strength, client_weighting=client_weighting)
  if model_aggregator is None:
    model_aggregator = diagnosed_mean.diagnosed_mean_factory(clipping=False)
  weighted = not isinstance(model_aggregator,
                            tff.aggregators.UnweightedAggregationFactory)
  optimizer = client_work_lib.client_optimizer(client_learning_rate,
                                               client_momentum)
  weights_type = tff.learning.models.weights_type_from_model(model_fn)
  aggregation = fused.FusedAggregation(model_aggregator,
                                       weights_type.trainable,
                                       weighted=weighted,
                                       fednova=report_normalizer)

  return fused.build_fused_process(
      model_fn,
      initial_hparams_fn=client_program_lib.optimizer_hparams_fn(optimizer),
      program_fn=client_work_lib.client_program(
          optimizer, proximal_strength=proximal_strength,
          expected_steps=expected_steps, guessed_steps=guessed_steps,
          client_weighting=client_weighting,
          report_normalizer=report_normalizer),
      aggregation=aggregation,
      server_optimizer=server_optimizer,
      client_measurements_fn=client_work_lib.client_measurements,
      metrics_aggregator=metrics_aggregator,
      resident_examples=resident_examples,
      shard_computation_fn=fl_lanes.shard_computation_fn(lanes))
