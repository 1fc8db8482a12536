"""The tuned learning rates of SPEC.md §1 are looked up as the paper gives."""

import pytest

from experiment_driver import tuned_defaults


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


def test_yogi_takes_adams_rates_and_synthetic_its_own():
  assert tuned_defaults.learning_rates('emnist', 'yogi') == (0.001, 0.1)
  assert tuned_defaults.learning_rates('synthetic', 'adam') == (1.0, 0.1)
