"""FedOpt and FedSGD with fused cohorts: one TFF client trains a shard of
real clients.

`build_fused_fedopt` is `build_fedopt(..., execution=OnShards(lanes,
resident_examples))` (`fl_common.execution`), under the name callers know:
the same algorithm as `build_fedopt` with the
driver's aggregator (`fl_common.diagnosed_mean`: the mean, adaptive clipping
and the paper's diagnostics), in which a TFF client stands for a shard of
real clients, trained one after the other in one TensorFlow graph
(`fl_common.fused`, which says how and why). Each client of a shard starts
from the broadcast model with a fresh client optimizer state and takes one
local step per batch, as `build_fedopt`'s client work; its update is
screened, weighted (examples, or uniform) and clipped as the per-client
aggregator does. State, metrics and their structure are `build_fedopt`'s,
so checkpoints and metric names carry over (`tests/large_cohort/test_fused.py`).
`build_fused_fedsgd` is `build_fedsgd` (TFF's FedSGD) on shards in the same
way: each client's gradient is the example-weighted mean of its batch
gradients at the broadcast model.
"""

from collections.abc import Callable
from typing import Any, Optional

import tensorflow_federated as tff

from fl_common import execution as fl_execution
from large_cohort import fedopt

ModelFn = Callable[[], tff.learning.models.VariableModel]


def build_fused_fedopt(model_fn: ModelFn, *,
                       resident_examples: Optional[Any] = None,
                       lanes: int = 1,
                       **kwargs) -> tff.learning.templates.LearningProcess:
  """`fedopt.build_fedopt` on shards of clients (module docstring), its
  other keywords as there:

      next: (<state@SERVER, {shard}@CLIENTS> -> LearningProcessOutput(
             state@SERVER, metrics@SERVER))

  Raises:
    TypeError, ValueError: As `build_fedopt`'s on shards; ValueError if
      `lanes` < 1.
  """
  return fedopt.build_fedopt(model_fn, execution=fl_execution.OnShards(
      lanes=lanes, resident_examples=resident_examples), **kwargs)


def build_fused_fedsgd(model_fn: ModelFn, *,
                       resident_examples: Optional[Any] = None,
                       lanes: int = 1,
                       **kwargs) -> tff.learning.templates.LearningProcess:
  """`fedopt.build_fedsgd` on shards of clients (module docstring), its
  other keywords as there."""
  return fedopt.build_fedsgd(model_fn, execution=fl_execution.OnShards(
      lanes=lanes, resident_examples=resident_examples), **kwargs)
