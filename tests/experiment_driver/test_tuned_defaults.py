"""The tuned learning rates of SPEC.md §1 are looked up as the paper gives,
from the optimizer registry; a missing one is an error, never a default."""

import pytest

from experiment_driver import tuned_defaults
from fl_common import optimizers
import tasks


@pytest.mark.parametrize('task,optimizer,expected', [
    ('stackoverflow', 'sgd', (1.0, 10.0)),
    ('emnist', 'adagrad', (0.1, 0.001)),
    ('shakespeare', 'sgdm', (0.1, 1.0)),
    ('cifar100', 'lamb', (0.001, 0.01)),
    ('stackoverflow', 'lars', (0.01, 1.0)),
    ('emnist', 'adam', (0.001, 0.1)),
])
def test_paper_table(task, optimizer, expected):
  assert tuned_defaults.learning_rates(task, optimizer) == expected


def test_fedsgd_has_only_a_server_rate():
  assert tuned_defaults.learning_rates('stackoverflow', 'sgd',
                                       fedsgd=True) == (10.0, 1.0)
  assert tuned_defaults.learning_rates('emnist', 'adam',
                                       fedsgd=True) == (0.1, 1.0)


def test_yogi_takes_adams_rates_and_fedavg_has_the_packages_tasks():
  assert tuned_defaults.learning_rates('emnist', 'yogi') == (0.001, 0.1)
  assert tuned_defaults.learning_rates('synthetic', 'sgd') == (1.0, 0.1)
  assert tuned_defaults.learning_rates('digits', 'sgd') == (1.0, 0.1)


@pytest.mark.parametrize('task,optimizer', [
    ('synthetic', 'sgdm'), ('digits', 'lamb'), ('cifar10', 'adam')])
def test_a_rate_never_tuned_is_an_error_naming_what_to_give(task, optimizer):
  with pytest.raises(tuned_defaults.MissingTunedRateError,
                     match=f'--server_optimizer={optimizer} on --task={task}'):
    tuned_defaults.learning_rates(task, optimizer)


def test_tuned_tasks_are_tasks_and_fedavg_and_fedsgd_are_tuned_together():
  # An untuned task stays out of the rates (its runs give them); a task tuned
  # for FedAvg is tuned for FedSGD too, and the paper's four tasks are.
  assert set(tuned_defaults.TUNED_RATES) <= set(optimizers.OPTIMIZER_NAMES)
  for name, rates in tuned_defaults.TUNED_RATES.items():
    assert set(rates) <= set(tasks.TASK_NAMES), name
    assert all(s > 0 and c > 0 for s, c in rates.values())
  fedavg = set(tuned_defaults.TUNED_RATES['sgd'])
  assert set(tuned_defaults.FEDSGD_SERVER_RATES) == fedavg
  assert {'cifar100', 'emnist', 'shakespeare', 'stackoverflow'} <= fedavg
  assert all(rate > 0 for rate in tuned_defaults.FEDSGD_SERVER_RATES.values())


def test_an_optimizer_without_tuned_rates_is_an_error_naming_what_to_give():
  # A new optimizer (docs/extending.md) has none until they are tuned.
  with pytest.raises(tuned_defaults.MissingTunedRateError,
                     match='--server_optimizer=rmsprop on --task=emnist'):
    tuned_defaults.learning_rates('emnist', 'rmsprop')
