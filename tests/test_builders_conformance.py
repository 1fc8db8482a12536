"""One conformance suite over every public builder of the three papers.

Each builder, on a tiny linear model and the same clients: builds and trains
two rounds; a client whose data hold NaN never reaches the model (and a
stateful client keeps its old state); the server state survives a checkpoint
round trip through TFF's program state manager and training goes on exactly
as without it; the same seed gives the same result. Each algorithm's math is
checked against NumPy in its own test module.
"""

import asyncio
import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

import adabest_tff
from adabest_tff import stateful_process
from fl_common import diagnosed_mean
from fl_common import shards
import gel_tff
import large_cohort
from tests import tiny_models

NUM_FEATURES = 3
CLIENT_SIZES = {'a': 3, 'b': 5, 'c': 8}
POPULATION = len(CLIENT_SIZES) + 1


def _sgd(rate):
  return tff.learning.optimizers.build_sgdm(rate)


BUILDERS = {
    'fedopt': lambda m: large_cohort.build_fedopt(
        m, client_optimizer=_sgd(0.1), server_optimizer=_sgd(1.0)),
    'fedopt_lamb': lambda m: large_cohort.build_fedopt(
        m, client_optimizer=_sgd(0.1),
        server_optimizer=large_cohort.build_lamb(0.01)),
    'fedopt_uniform': lambda m: large_cohort.build_fedopt(
        m, client_optimizer=_sgd(0.1), server_optimizer=_sgd(1.0),
        client_weighting=tff.learning.ClientWeighting.UNIFORM),
    # Its client data are shards of clients (`_Run.round` makes them).
    'fused_fedopt': lambda m: large_cohort.build_fused_fedopt(
        m, client_optimizer=_sgd(0.1), server_optimizer=_sgd(1.0),
        model_aggregator=diagnosed_mean.diagnosed_mean_factory()),
    'fedsgd': lambda m: large_cohort.build_fedsgd(
        m, server_optimizer=_sgd(0.1)),
    'normalized_fed_avg': lambda m: large_cohort.build_normalized_fed_avg(
        m, client_optimizer=_sgd(0.1), server_learning_rate=0.1),
    'adabest': lambda m: adabest_tff.build_adabest(m),
    'feddyn': lambda m: adabest_tff.build_feddyn(
        m, population_size=POPULATION),
    'scaffold': lambda m: adabest_tff.build_scaffold(
        m, population_size=POPULATION),
    'fused_adabest': lambda m: adabest_tff.build_adabest(m, on_shards=True),
    'fused_feddyn': lambda m: adabest_tff.build_feddyn(
        m, population_size=POPULATION, on_shards=True),
    'fused_scaffold': lambda m: adabest_tff.build_scaffold(
        m, population_size=POPULATION, on_shards=True),
    **{f'{base}_gel': (lambda m, base=base: gel_tff.build_gel(
        m, base=base, client_learning_rate=0.05, expected_steps=6))
       for base in gel_tff.BASES},
    **{f'{base}_budgeted': (lambda m, base=base: gel_tff.build_budgeted_baseline(
        m, base=base, client_learning_rate=0.05)) for base in gel_tff.BASES},
    'fused_fednova_gel': lambda m: gel_tff.build_fused_gel(
        m, base='fednova', client_learning_rate=0.05, expected_steps=6,
        model_aggregator=diagnosed_mean.diagnosed_mean_factory()),
    'fused_fedprox_budgeted': lambda m: gel_tff.build_fused_budgeted_baseline(
        m, base='fedprox', client_learning_rate=0.05,
        model_aggregator=diagnosed_mean.diagnosed_mean_factory()),
}


def _dataset(client_id, nan=False):
  rng = np.random.default_rng(sorted(CLIENT_SIZES).index(client_id))
  n = CLIENT_SIZES[client_id]
  x = rng.normal(size=(n, NUM_FEATURES)).astype(np.float32)
  if nan:
    x[0, 0] = np.nan
  y = rng.normal(size=(n, 1)).astype(np.float32)
  return tf.data.Dataset.from_tensor_slices(
      collections.OrderedDict(x=x, y=y)).batch(2)


class _Run:
  """A process trained round by round, stateful clients included."""

  def __init__(self, name, tmp_path, seed=0):
    tf.keras.utils.set_random_seed(seed)
    self.name = name
    self.process = BUILDERS[name](tiny_models.linear_model_fn(NUM_FEATURES))
    self.runner = None
    if isinstance(self.process, stateful_process.StatefulClientLearningProcess):
      self.runner = adabest_tff.StatefulClientRunner(
          self.process, adabest_tff.ClientStateStore(
              str(tmp_path / f'{name}_{seed}_{id(self)}'),
              self.process.initial_client_state()))
    self.state = self.process.initialize()

  def round(self, client_ids, nan_client=None, round_num=None):
    datasets = [_dataset(c, nan=c == nan_client) for c in client_ids]
    if self.name.startswith('fused_'):
      datasets = shards.shards_from_datasets(datasets, 2)
    if self.runner is None:
      output = self.process.next(self.state, datasets)
    else:
      output = self.runner.next(self.state, client_ids, datasets, round_num)
    self.state = output.state
    return output.metrics

  def weights(self):
    return tiny_models.flat(self.process.get_model_weights(self.state).trainable)


@pytest.fixture(params=sorted(BUILDERS))
def name(request):
  return request.param


def test_builds_and_trains_two_rounds(name, tmp_path):
  run = _Run(name, tmp_path)
  initial = run.weights()
  run.round(['a', 'b'])
  run.round(['b', 'c'])
  assert np.all(np.isfinite(run.weights()))
  assert not np.allclose(run.weights(), initial)


def test_a_nan_client_never_reaches_the_model(name, tmp_path):
  run = _Run(name, tmp_path)
  run.round(['a', 'b'])
  if run.runner is not None:
    before = run.runner.store.load(['c'])
  run.round(['a', 'b', 'c'], nan_client='c')
  assert np.all(np.isfinite(run.weights()))
  run.round(['a', 'b'])
  assert np.all(np.isfinite(run.weights()))
  if run.runner is not None:
    after = run.runner.store.load(['c'])
    for old, new in zip(tf.nest.flatten(before), tf.nest.flatten(after)):
      np.testing.assert_array_equal(np.asarray(old), np.asarray(new))


def test_state_survives_a_checkpoint_round_trip(name, tmp_path):
  run = _Run(name, tmp_path)
  run.round(['a', 'b'])
  if run.runner is not None:
    run.runner.store.commit(1)
  manager = tff.program.FileProgramStateManager(str(tmp_path / 'ckpt'))
  asyncio.run(manager.save(run.state, 1))
  restored, version = asyncio.run(manager.load_latest(run.state))
  assert version == 1
  for saved, loaded in zip(tf.nest.flatten(run.state),
                           tf.nest.flatten(restored)):
    np.testing.assert_array_equal(np.asarray(saved), np.asarray(loaded))
  run.round(['b', 'c'], round_num=2)
  continued = run.weights()
  # Resume: the restored state, and the client states of the checkpoint.
  if run.runner is not None:
    run.runner.store.restore(1)
  run.state = restored
  run.round(['b', 'c'], round_num=2)
  np.testing.assert_array_equal(run.weights(), continued)


def test_same_seed_same_result(name, tmp_path):
  results = []
  for _ in range(2):
    run = _Run(name, tmp_path, seed=7)
    run.round(['a', 'b'])
    run.round(['b', 'c'])
    results.append(run.weights())
  np.testing.assert_array_equal(results[0], results[1])
