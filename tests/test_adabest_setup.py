"""The AdaBest family's driver hooks: flags, builders, bytes metrics."""


from absl import flags
from absl.testing import flagsaver
import numpy as np
import pytest

from fl_common import communication
from adabest_tff import stateful_process
from experiment_driver import adabest_setup
from experiment_driver import algorithm_setup
from tests import tiny_models

FLAGS = flags.FLAGS
NUM_FEATURES = 3
CLIENT_IDS = ['a', 'b', 'c', 'd']


@pytest.fixture(autouse=True, scope='module')
def parsed_flags():
  if not FLAGS.is_parsed():
    FLAGS.mark_as_parsed()


def build_context(client_learning_rate=0.3):
  return algorithm_setup.BuildContext(
      task_name='tiny',
      task=tiny_models.regression_task(
          dict.fromkeys(CLIENT_IDS, 4), NUM_FEATURES, batch_size=2),
      client_learning_rate=client_learning_rate, server_learning_rate=1.0,
      clients_per_round=2, num_train_clients=len(CLIENT_IDS), total_rounds=2,
      seed=1)


@pytest.mark.parametrize('name', ['adabest', 'feddyn', 'scaffold'])
def test_builds_stateful_process_with_bytes_metrics(name):
  setup = adabest_setup.ALGORITHMS[name](build_context())
  assert isinstance(setup.process,
                    stateful_process.StatefulClientLearningProcess)
  cost = communication.communication_cost(setup.process)
  metrics = setup.round_metrics_fn(1, ['a', 'b', 'c'], {})
  assert metrics == {'bytes_down': 3.0 * cost.bytes_down,
                     'bytes_up': 3.0 * cost.bytes_up}


@pytest.mark.parametrize('name', ['adabest', 'feddyn', 'scaffold'])
def test_reports_the_diagnostics_of_the_other_families(name):
  # The mean is wrapped in fl_common.diagnostics (whose values are checked
  # against NumPy in test_diagnostics.py).
  context = build_context()
  process = adabest_setup.ALGORITHMS[name](context).process
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
    process = adabest_setup.ALGORITHMS['adabest'](build_context()).process
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
