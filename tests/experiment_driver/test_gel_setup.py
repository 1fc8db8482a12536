"""The GeL family's driver hooks: flags, task defaults, budgets, accounting."""

import json

from absl import flags
from absl.testing import flagsaver
import numpy as np
import pandas as pd
import pytest
import tensorflow_federated as tff

from experiment_driver import algorithm_setup
from experiment_driver import flag_rules
from experiment_driver import gel_setup
from fl_common import diagnosed_mean
from fl_common import run_layout
from gel_tff import accounting
from tests import fused_checks
from tests import tiny_models

FLAGS = flags.FLAGS
NUM_FEATURES = 3
BATCH_SIZE = 2
CLIENT_IDS = ['a', 'b', 'c']


@pytest.fixture(autouse=True, scope='module')
def parsed_flags():
  if not FLAGS.is_parsed():
    FLAGS.mark_as_parsed()


def build_context(task_name, *, uniform_weighting=False,
                  client_learning_rate=0.1, aggregator=None):
  if aggregator is not None:
    pass
  elif uniform_weighting:
    aggregator = tff.aggregators.UnweightedMeanFactory()
  else:
    aggregator = tff.aggregators.MeanFactory()
  return algorithm_setup.BuildContext(
      task_name=task_name,
      task=tiny_models.regression_task(dict(zip(CLIENT_IDS, (3, 5, 8))),
                                       NUM_FEATURES, BATCH_SIZE),
      client_learning_rate=client_learning_rate, server_learning_rate=None,
      model_aggregator=aggregator,
      client_weighting=(tff.learning.ClientWeighting.UNIFORM
                        if uniform_weighting else
                        tff.learning.ClientWeighting.NUM_EXAMPLES),
      clients_per_round=len(CLIENT_IDS), num_train_clients=len(CLIENT_IDS),
      total_rounds=2, seed=4)


def built(algorithm, task_name, clients_per_shard=None, **context_kwargs):
  """The driver's setup of `algorithm` (on shards for the MeanFactory's
  aggregators only if the driver's decision finds them fusable)."""
  context = build_context(task_name, **context_kwargs)
  return algorithm_setup.realize(
      gel_setup.ALGORITHMS[algorithm](context), context,
      algorithm_setup.ExecutionSettings(clients_per_shard=clients_per_shard))


def test_one_algorithm_per_table_3_row_with_and_without_gel():
  assert set(gel_setup.ALGORITHMS) == {
      f'{base}_{kind}'
      for base in ('fedavg', 'fedavgcm', 'fedprox', 'fednova', 'fedyogi')
      for kind in ('gel', 'budgeted')}


def test_parse_guessed_steps():
  assert gel_setup.parse_guessed_steps('remaining') == 'remaining'
  assert gel_setup.parse_guessed_steps('infinite') == 'infinite'
  assert gel_setup.parse_guessed_steps('12') == 12
  for bad in ('-3', 'inf', '2.5'):
    with pytest.raises(ValueError, match=bad):
      gel_setup.parse_guessed_steps(bad)
  with flagsaver.flagsaver(), pytest.raises(flags.IllegalFlagValueError):
    FLAGS.guessed_steps = 'sometimes'


def test_step_budgets_from_task_or_flags():
  emnist = gel_setup.step_budgets('emnist', seed=1)
  assert (emnist.budget_min, emnist.budget_max, emnist.seed) == (4, 20, 1)
  assert (gel_setup.step_budgets('shakespeare', 0).budget_max,
          gel_setup.step_budgets('synthetic', 0).budget_max) == (30, 13)
  with flagsaver.flagsaver(budget_max=8):
    assert gel_setup.step_budgets('emnist', 0).budget_max == 8
  with pytest.raises(ValueError, match='cifar100'):
    gel_setup.step_budgets('cifar100', 0)


@flagsaver.flagsaver(budget_min=2, budget_max=4, expected_steps=6)
def test_fednova_gel_setup_runs_a_budgeted_round_and_accounts_for_it():
  setup = built('fednova_gel', 'unlisted_task')
  datasets = setup.client_datasets_fn(1, CLIENT_IDS)
  budgets = [sum(1 for _ in d) for d in datasets]
  assert all(2 <= b <= 4 for b in budgets)
  output = setup.process.next(setup.process.initialize(), datasets)
  extra = setup.round_metrics_fn(1, CLIENT_IDS, output.metrics)
  assert extra[accounting.GRADIENT_COMPUTATIONS] == sum(budgets)
  assert output.metrics['client_work']['gradient_steps'] == sum(budgets)
  # Down: kernel + bias; up: their deltas + FedNova's float32 normalizer.
  assert extra[accounting.BYTES_DOWN] == len(CLIENT_IDS) * (
      NUM_FEATURES + 1) * 4
  assert extra[accounting.BYTES_UP] == len(CLIENT_IDS) * (
      (NUM_FEATURES + 1) * 4 + 4)
  assert output.metrics['aggregator']['effective_steps'] > 0


@pytest.mark.parametrize('algorithm', ['fednova_gel', 'fedprox_budgeted'])
@flagsaver.flagsaver(budget_min=2, budget_max=4, expected_steps=6)
def test_with_the_drivers_aggregator_rounds_run_on_shards(algorithm):
  # The driver's aggregator: GeL runs fused by default; its shards hold each
  # client's budgeted batches, and the round equals the per-client one.
  aggregator = diagnosed_mean.diagnosed_mean_factory(
      clipping=True, initial_clipping_norm=0.1)
  fused_setup = built(
      algorithm, 'unlisted_task', aggregator=aggregator, clients_per_shard=2)
  per_client = built(
      algorithm, 'unlisted_task', aggregator=aggregator, clients_per_shard=1)
  state = per_client.process.initialize()
  datasets = per_client.client_datasets_fn(1, CLIENT_IDS)
  sizes = [[len(b['y']) for b in d] for d in datasets]
  budgets = [len(s) for s in sizes]
  made = fused_setup.client_datasets_fn(1, CLIENT_IDS)
  assert [list(s['batch_sizes']) for s in made] == [
      sizes[0] + [0] + sizes[1] + [0], sizes[2] + [0]]
  output = per_client.process.next(state, datasets)
  fused_output = fused_setup.process.next(state, made)
  fused_checks.assert_close(output.state, fused_output.state)
  fused_checks.assert_close(output.metrics, fused_output.metrics)
  assert fused_output.metrics['client_work']['gradient_steps'] == sum(budgets)
  assert fused_setup.round_metrics_fn(1, CLIENT_IDS, fused_output.metrics)[
      accounting.GRADIENT_COMPUTATIONS] == sum(budgets)


def client_learning_rate(algorithm, task_name):
  """The rate the driver records for the run, checked to be the one used."""
  with flagsaver.flagsaver(task=task_name, algorithm=algorithm):
    rate = flag_rules.effective_hparams(flag_rules.values_of())[
        'client_learning_rate']
  process = built(
      algorithm, task_name, client_learning_rate=rate).process
  assert process.get_hparams(process.initialize())['client_work'][
      'learning_rate'] == pytest.approx(rate)
  return rate


def test_client_learning_rates_follow_the_paper_unless_set():
  assert client_learning_rate('fedavgcm_gel', 'emnist') == pytest.approx(0.02)
  assert client_learning_rate('fedavg_gel', 'emnist') == pytest.approx(0.02)
  assert client_learning_rate('fedavg_budgeted', 'emnist') == pytest.approx(
      0.06)
  assert client_learning_rate('fedyogi_gel', 'emnist') == pytest.approx(
      10**-1.5)
  with flagsaver.flagsaver(client_learning_rate=0.7):
    assert client_learning_rate('fedprox_gel', 'emnist') == pytest.approx(0.7)


def test_uniform_weighting_with_unweighted_aggregator():
  setup = built(
      'fedavgcm_budgeted', 'synthetic', uniform_weighting=True)
  state = setup.process.initialize()
  output = setup.process.next(state, setup.client_datasets_fn(1, CLIENT_IDS))
  assert output.metrics['client_work']['gradient_steps'] > 0
  assert not np.allclose(
      setup.process.get_model_weights(output.state).trainable[0],
      setup.process.get_model_weights(state).trainable[0])


def write_metrics(directory, accuracies):
  directory.mkdir()
  pd.DataFrame({
      'round': range(1, len(accuracies) + 1),
      'test/accuracy': accuracies,
      accounting.GRADIENT_COMPUTATIONS: [10.0] * len(accuracies),
      accounting.BYTES_DOWN: [50.0] * len(accuracies),
      accounting.BYTES_UP: [50.0] * len(accuracies),
  }).to_csv(directory / run_layout.METRICS_FILE, index=False)
  return str(directory)


def test_write_run_summary_uses_task_target_and_baseline(tmp_path):
  run_dir = write_metrics(tmp_path / 'gel', [0.5, 0.86, 0.9])
  baseline_dir = write_metrics(tmp_path / 'baseline', [0.5, 0.6, 0.7, 0.88])
  with flagsaver.flagsaver(baseline_run_dir=baseline_dir):
    summary = gel_setup.write_run_summary(run_dir, 'synthetic')
  assert summary['rounds_to_target'] == 2  # Synthetic's target is 85 %.
  assert summary['speedup'] == 1.0
  with open(tmp_path / 'gel' / 'gel_summary.json') as f:
    assert json.load(f)['target_accuracy'] == 0.85
  with pytest.raises(ValueError, match='cifar100'):
    gel_setup.write_run_summary(run_dir, 'cifar100')


def test_a_target_metric_without_its_split_is_refused_before_training():
  # The tiny task has no validation clients.
  with flagsaver.flagsaver(target_metric='validation/accuracy'):
    with pytest.raises(ValueError, match='no validation clients'):
      built('fedavgcm_gel', 'synthetic')
