"""The AdaBest family's driver hooks: flags, builders, bytes metrics."""


from absl import flags
from absl.testing import flagsaver
import numpy as np
import pytest

from fl_engine import stateful_runner as runner_lib
from fl_engine import stateful_process
from fl_common import communication
from fl_engine import shards
from experiment_driver import adabest_setup
from experiment_driver import algorithm_setup
from tests import fused_checks
from tests import tiny_models

FLAGS = flags.FLAGS
NUM_FEATURES = 3
CLIENT_IDS = ['a', 'b', 'c', 'd']


@pytest.fixture(autouse=True, scope='module')
def parsed_flags():
  if not FLAGS.is_parsed():
    FLAGS.mark_as_parsed()


def build_context(client_learning_rate=0.3, client_sizes=None):
  return algorithm_setup.BuildContext(
      task_name='tiny',
      task=tiny_models.regression_task(
          client_sizes or dict.fromkeys(CLIENT_IDS, 4), NUM_FEATURES,
          batch_size=2),
      client_learning_rate=client_learning_rate, server_learning_rate=1.0,
      clients_per_round=2, num_train_clients=len(CLIENT_IDS), total_rounds=2,
      seed=1)


def built(name, clients_per_shard=1, **context_kwargs):
  """The driver's setup of `name` (per client unless `clients_per_shard`
  is not 1)."""
  context = build_context(**context_kwargs)
  return algorithm_setup.realize(
      adabest_setup.ALGORITHMS[name](context), context,
      algorithm_setup.ExecutionSettings(clients_per_shard=clients_per_shard))


@pytest.mark.parametrize('name', ['adabest', 'feddyn', 'scaffold'])
def test_builds_stateful_process_with_bytes_metrics(name):
  setup = built(name)
  assert isinstance(setup.process,
                    stateful_process.StatefulClientLearningProcess)
  assert not setup.process.on_shards and setup.client_datasets_fn is None
  cost = communication.communication_cost(setup.process)
  metrics = setup.round_metrics_fn(1, ['a', 'b', 'c'], {})
  assert metrics == {'bytes_down': 3.0 * cost.bytes_down,
                     'bytes_up': 3.0 * cost.bytes_up}
  # On shards (the default), the bytes are still one client's.
  fused_setup = built(name, clients_per_shard=None)
  assert fused_setup.process.on_shards
  assert fused_setup.round_metrics_fn(1, ['a', 'b', 'c'], {}) == metrics


@pytest.mark.parametrize('name', ['adabest', 'feddyn', 'scaffold'])
def test_the_default_rounds_on_shards_equal_rounds_per_client(name):
  client_sizes = {'a': 3, 'b': 5, 'c': 0, 'd': 4}
  per_client = built(name, client_sizes=client_sizes)
  fused_setup = built(name, client_sizes=client_sizes, clients_per_shard=None)
  made = fused_setup.client_datasets_fn(1, CLIENT_IDS)
  assert sum(shards.num_clients(shard) for shard in made) == len(CLIENT_IDS)
  context = build_context(client_sizes=client_sizes)
  datasets = context.task.datasets
  client_datasets = [datasets.train_preprocess_fn(
      datasets.train_data.create_tf_dataset_for_client(cid))
                     for cid in CLIENT_IDS]
  runner = runner_lib.StatefulClientRunner(per_client.process)
  fused_runner = runner_lib.StatefulClientRunner(fused_setup.process)
  state = per_client.process.initialize()
  output = runner.next(state, CLIENT_IDS, client_datasets)
  fused_output = fused_runner.next(state, CLIENT_IDS, made)
  fused_checks.assert_same_stateful_round(output, fused_output, runner,
                                          fused_runner, CLIENT_IDS)


@pytest.mark.parametrize('name', ['adabest', 'feddyn', 'scaffold'])
def test_reports_the_diagnostics_of_the_other_families(name):
  # The mean is wrapped in fl_common.diagnostics (whose values are checked
  # against NumPy in tests/fl_common/test_diagnostics.py).
  context = build_context()
  process = built(name).process
  datasets = context.task.datasets
  (_, metrics, _), = tiny_models.run_stateful_rounds(
      process, [['a', 'b']], lambda cid: datasets.train_preprocess_fn(
          datasets.train_data.create_tf_dataset_for_client(cid)))
  aggregator = metrics['aggregator']
  assert aggregator['num_clients'] == 2
  assert aggregator['num_zero_updates'] == 0
  assert aggregator['num_nonfinite_updates'] == 0
  assert aggregator['update_norm'] > 0.0
  assert -1.0 <= aggregator['mean_pairwise_cosine'] <= 1.0


def test_beta_flag_reaches_the_server_optimizer():
  with flagsaver.flagsaver(adabest_beta=0.4):
    process = built('adabest').process
  hparams = process.get_hparams(process.initialize())
  np.testing.assert_allclose(hparams['finalizer']['beta'], 0.4)


def test_learning_rates_default_to_the_papers():
  unset = {'client_learning_rate': None, 'server_learning_rate': None}
  assert adabest_setup.effective_hparams('adabest', unset) == {
      'client_learning_rate': 0.1}
  assert adabest_setup.effective_hparams(
      'scaffold', dict(unset, client_learning_rate=0.3)) == {
          'client_learning_rate': 0.3, 'server_learning_rate': 1.0}
  assert adabest_setup.effective_hparams(
      'scaffold', dict(unset, server_learning_rate=0.5))[
          'server_learning_rate'] == 0.5


def test_flag_bounds_reject_bad_values():
  with flagsaver.flagsaver(), pytest.raises(flags.IllegalFlagValueError):
    FLAGS.adabest_beta = 1.5
  with flagsaver.flagsaver(), pytest.raises(flags.IllegalFlagValueError):
    FLAGS['adabest_client_weighting'].parse('by_size')
