"""fl_engine.lanes: a fused FedOpt round whose shards train their clients
side by side (vectorized over lanes) equals the per-client round on the
same clients: model, clipping norm, server optimizer state, the paper's
diagnostics and the training metrics, with uneven client sizes (short last
batches: lanes of one step differ in batch size), an empty client, a NaN
client, shards of uneven length, groups of lanes cut short, and a
classifier whose accuracy metric and softmax go through the vectorized
forward pass, and client optimizers with a step counter or a norm; lanes
refuse models they cannot vectorize. (GeL's, FedSGD's and the stateful
algorithms' rounds on lanes: `tests/gel_tff/test_gel_on_shards.py`,
`tests/large_cohort/test_fedopt_on_shards.py`, `tests/fl_engine/test_fused_stateful.py`.)"""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from adabest_tff import adabest
from fl_common import diagnosed_mean
from fl_engine import execution
from fl_engine import lanes as lanes_lib
from fl_engine import resident
from fl_engine import shards
from large_cohort import fedopt
from fl_common import optimizers
from tests import fused_checks
from tests import tiny_models


def _kwargs(weighting=tff.learning.ClientWeighting.NUM_EXAMPLES,
            clipping=True, momentum=0.5):
  return dict(
      client_optimizer=tff.learning.optimizers.build_sgdm(
          0.1, momentum=momentum),
      server_optimizer=tff.learning.optimizers.build_adam(
          0.05, epsilon=fused_checks.ADAM_EPSILON),
      client_weighting=weighting,
      model_aggregator=diagnosed_mean.diagnosed_mean_factory(
          clipping=clipping,
          weighted=weighting is tff.learning.ClientWeighting.NUM_EXAMPLES,
          initial_clipping_norm=0.05))


@pytest.mark.parametrize('weighting, clipping, momentum', [
    (tff.learning.ClientWeighting.NUM_EXAMPLES, True, 0.5),
    (tff.learning.ClientWeighting.UNIFORM, False, 0.0),
])
@pytest.mark.parametrize('clients_per_shard, lanes', [(7, 3), (4, 2),
                                                      (7, 64)])
def test_a_round_on_lanes_equals_the_per_client_round(
    weighting, clipping, momentum, clients_per_shard, lanes):
  model_fn = tiny_models.linear_model_fn(fused_checks.NUM_FEATURES)
  kwargs = _kwargs(weighting, clipping, momentum)
  per_client = fedopt.build_fedopt(model_fn, **kwargs)
  on_lanes = fused_checks.on_shards(fedopt.build_fedopt, model_fn, lanes=lanes, **kwargs)
  assert (on_lanes.initialize.type_signature ==
          per_client.initialize.type_signature)
  sizes = [5, 1, 0, 8, 3, 4, 2]
  datasets = fused_checks.client_datasets(sizes, nan_client=4)
  state = lanes_state = per_client.initialize()
  for _ in range(2):
    output, lanes_output = fused_checks.assert_same_round(
        per_client, on_lanes, state, lanes_state, datasets,
        clients_per_shard)
    state, lanes_state = output.state, lanes_output.state
  fused_checks.assert_screened(lanes_output.metrics, sizes, nan_client=4)


def _classifier_fn(regularizer=None):
  def model_fn():
    keras_model = tf.keras.Sequential([
        tf.keras.layers.Dense(4, activation='relu', input_shape=(6,),
                              kernel_regularizer=regularizer),
        tf.keras.layers.Dense(3, activation='softmax')])
    return tff.learning.models.from_keras_model(
        keras_model, loss=tf.keras.losses.SparseCategoricalCrossentropy(),
        input_spec=collections.OrderedDict(
            x=tf.TensorSpec([None, 6], tf.float32),
            y=tf.TensorSpec([None, 1], tf.int32)),
        metrics=[tf.keras.metrics.SparseCategoricalAccuracy()])
  return model_fn


def test_resident_rows_on_lanes_train_a_classifier_as_one_by_one():
  rng = np.random.default_rng(3)
  sizes = [7, 12, 3, 9, 0, 15, 4, 6, 11]
  total = sum(sizes)
  arrays = collections.OrderedDict(
      x=rng.normal(size=(total, 6)).astype(np.float32),
      y=rng.integers(0, 3, (total, 1)).astype(np.int32))
  client_rows = np.split(rng.permutation(total), np.cumsum(sizes)[:-1])
  recipe = shards.BatchRecipe(batch_size=4, num_epochs=2)

  def round_shards(seed):
    return shards.shards_from_arrays(
        arrays, client_rows, recipe=recipe, clients_per_shard=5,
        rng=np.random.default_rng(seed), rows_only=True)

  kwargs = _kwargs(clipping=False, momentum=0.0)
  model_fn = _classifier_fn()
  held = resident.ResidentExamples(arrays)
  one_by_one = fused_checks.on_shards(fedopt.build_fedopt, model_fn, resident_examples=held,
                                        **kwargs)
  on_lanes = fused_checks.on_shards(fedopt.build_fedopt, model_fn, resident_examples=held,
                                      lanes=2, **kwargs)
  state = lanes_state = one_by_one.initialize()
  for round_num in range(2):
    output = one_by_one.next(state, round_shards(round_num))
    lanes_output = on_lanes.next(lanes_state, round_shards(round_num))
    fused_checks.assert_close(output.state, lanes_output.state)
    fused_checks.assert_close(output.metrics, lanes_output.metrics)
    state, lanes_state = output.state, lanes_output.state
  train = lanes_output.metrics['client_work']['train']
  assert train['num_examples'] == 2 * total
  assert 0.0 < train['sparse_categorical_accuracy'] < 1.0


@pytest.mark.parametrize('name', ['adam', 'yogi', 'lars', 'lamb'])
def test_a_client_optimizer_with_a_counter_or_a_norm_steps_per_lane(name):
  # Adam's step counter and LARS' per-weight norm are each lane's own.
  model_fn = tiny_models.linear_model_fn(fused_checks.NUM_FEATURES)
  kwargs = _kwargs()
  kwargs['client_optimizer'] = optimizers.build_optimizer(name, 0.05)
  per_client = fedopt.build_fedopt(model_fn, **kwargs)
  on_lanes = fused_checks.on_shards(fedopt.build_fedopt, model_fn, lanes=3, **kwargs)
  sizes = [5, 1, 0, 8, 3, 4, 2]
  datasets = fused_checks.client_datasets(sizes, nan_client=4)
  state = per_client.initialize()
  output, _ = fused_checks.assert_same_round(per_client, on_lanes, state,
                                             state, datasets, 7)
  assert not np.allclose(
      per_client.get_model_weights(output.state).trainable[0],
      per_client.get_model_weights(state).trainable[0])


def test_lanes_must_be_at_least_one_and_execution_typed():
  model_fn = tiny_models.linear_model_fn(fused_checks.NUM_FEATURES)
  with pytest.raises(ValueError, match='at least 1'):
    fused_checks.on_shards(fedopt.build_fedopt, model_fn, lanes=0, **_kwargs())
  with pytest.raises(ValueError, match='at least 1'):
    adabest.build_adabest(model_fn,
                          execution=execution.OnShards(lanes=0))
  with pytest.raises(TypeError, match='execution must be'):
    adabest.build_adabest(model_fn, execution='shards')


def test_auto_lanes_picks_lanes_for_a_small_model_that_vectorizes():
  small = tiny_models.linear_model_fn(fused_checks.NUM_FEATURES)
  assert lanes_lib.auto_lanes(small) == lanes_lib.DEFAULT_LANES
  large = tiny_models.linear_model_fn(lanes_lib.MAX_AUTO_LANE_WEIGHTS)
  assert lanes_lib.auto_lanes(large) == 1
  # On a GPU, lanes are wider kernels: a model of any size.
  assert lanes_lib.auto_lanes(large, on_gpu=True) == lanes_lib.DEFAULT_LANES
  few = lanes_lib.MIN_AUTO_LANE_CLIENTS
  assert lanes_lib.auto_lanes(small, few) == lanes_lib.DEFAULT_LANES
  assert lanes_lib.auto_lanes(small, few - 1) == 1


class _L2LossOp(tf.keras.losses.Loss):

  def call(self, y_true, y_pred):
    return tf.nn.l2_loss(y_pred - y_true)


def test_lanes_refuse_a_model_whose_forward_pass_does_not_vectorize():
  # pfor has no vectorized `L2Loss`; it could only loop over the lanes.
  def l2_loss_model_fn():
    keras_model = tf.keras.Sequential([
        tf.keras.layers.Dense(1, input_shape=(6,))])
    return tff.learning.models.from_keras_model(
        keras_model, loss=_L2LossOp(),
        input_spec=collections.OrderedDict(
            x=tf.TensorSpec([None, 6], tf.float32),
            y=tf.TensorSpec([None, 1], tf.float32)))

  with pytest.raises(ValueError, match=r'forward pass vectorizes \(.*L2Loss\)'):
    fused_checks.on_shards(fedopt.build_fedopt, l2_loss_model_fn, lanes=4, **_kwargs())
  assert lanes_lib.auto_lanes(l2_loss_model_fn) == 1
  # Keras' weight penalties vectorize (their variables are the lane's).
  penalized = _classifier_fn(tf.keras.regularizers.L2(0.01))
  assert lanes_lib.auto_lanes(penalized) == lanes_lib.DEFAULT_LANES
