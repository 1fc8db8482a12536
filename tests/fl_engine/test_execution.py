"""`fl_engine.execution`: the one keyword that says how clients run."""

import collections

import numpy as np
import pytest
import tensorflow_federated as tff

from fl_common import diagnosed_mean
from fl_engine import execution
from large_cohort import fedopt
from fl_common import optimizers
from tests import fused_checks
from tests import tiny_models


def test_on_shards_tells_the_two_executions_apart_and_refuses_others():
  assert not execution.on_shards(execution.PER_CLIENT)
  assert execution.on_shards(execution.OnShards())
  assert execution.on_shards(execution.OnShards(lanes=3))
  for wrong in (True, 'shards', None):
    with pytest.raises(TypeError, match='execution must be'):
      execution.on_shards(wrong)


@pytest.mark.parametrize('lanes', [0, -1, 1.5])
def test_lanes_must_be_a_positive_integer(lanes):
  with pytest.raises(ValueError, match='at least 1'):
    execution.OnShards(lanes=lanes)


def test_a_builder_takes_shards_with_on_shards_and_datasets_without():
  model_fn = tiny_models.linear_model_fn(fused_checks.NUM_FEATURES)
  kwargs = dict(client_optimizer=optimizers.build_optimizer('sgd', 0.1),
                server_optimizer=optimizers.build_optimizer('sgd', 1.0),
                model_aggregator=diagnosed_mean.diagnosed_mean_factory(
                    clipping=False))
  per_client = fedopt.build_fedopt(model_fn, **kwargs)
  on_shards = fedopt.build_fedopt(model_fn, execution=execution.OnShards(),
                                  **kwargs)
  on_rows = fedopt.build_fedopt(
      model_fn, execution=execution.OnShards(resident_examples=(
          collections.OrderedDict(
              x=np.zeros((4, fused_checks.NUM_FEATURES), np.float32),
              y=np.zeros((4, 1), np.float32)))), **kwargs)
  # The same state (checkpoints carry over); the client data differ: a
  # dataset, a shard of examples, a shard of rows.
  data_types = [p.next.type_signature.parameter[1].member
                for p in (per_client, on_shards, on_rows)]
  for process in (on_shards, on_rows):
    assert (process.initialize.type_signature ==
            per_client.initialize.type_signature)
  assert isinstance(data_types[0], tff.SequenceType)
  assert 'examples' in tff.types.type_to_tf_tensor_specs(data_types[1])
  assert 'rows' in tff.types.type_to_tf_tensor_specs(data_types[2])
