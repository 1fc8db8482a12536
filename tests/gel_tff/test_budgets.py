"""Client step budgets: range, seeding, and datasets cut to tau_i batches."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from gel_tff import budgets


def test_draws_cover_the_closed_range_and_only_it():
  draws = budgets.StepBudgets(4, 6, seed=0).draw(round_num=1, num_clients=600)
  assert len(draws) == 600
  assert set(draws) == {4, 5, 6}


def test_draws_are_reproducible_per_seed_and_round():
  step_budgets = budgets.StepBudgets(4, 20, seed=3)
  first = step_budgets.draw(round_num=7, num_clients=50)
  assert budgets.StepBudgets(4, 20, seed=3).draw(7, 50) == first
  assert step_budgets.draw(8, 50) != first
  assert budgets.StepBudgets(4, 20, seed=4).draw(7, 50) != first


def test_draws_look_uniform():
  draws = np.array(budgets.StepBudgets(4, 13, seed=1).draw(1, 20000))
  counts = np.bincount(draws, minlength=14)[4:]
  # Each of the 10 values has probability 0.1: 2000 +- 4.5 sigma (~190).
  assert np.all(np.abs(counts - 2000) < 190)


@pytest.mark.parametrize('budget_min, budget_max, bad_value', [
    (0, 5, '0'), (6, 5, '5'), (-2, 3, '-2')])
def test_bad_ranges_raise_value_error(budget_min, budget_max, bad_value):
  with pytest.raises(ValueError, match=bad_value):
    budgets.StepBudgets(budget_min, budget_max)


def test_limit_to_steps_cycles_through_the_batches():
  batched = tf.data.Dataset.range(3)
  assert list(budgets.limit_to_steps(batched, 7).as_numpy_iterator()) == [
      0, 1, 2, 0, 1, 2, 0]
  assert list(budgets.limit_to_steps(batched, 2).as_numpy_iterator()) == [0, 1]
  empty = tf.data.Dataset.range(0)
  assert list(budgets.limit_to_steps(empty, 5).as_numpy_iterator()) == []
  with pytest.raises(ValueError, match='-1'):
    budgets.limit_to_steps(batched, -1)


def test_client_datasets_have_their_budget_of_batches():
  client_data = tff.simulation.datasets.TestClientData({
      'few': collections.OrderedDict(x=np.arange(3, dtype=np.float32)),
      'many': collections.OrderedDict(x=np.arange(40, dtype=np.float32)),
  })
  step_budgets = budgets.StepBudgets(4, 9, seed=5)
  client_datasets_fn = budgets.build_client_datasets_fn(
      client_data, lambda dataset: dataset.batch(2), step_budgets)
  client_ids = ['few', 'many', 'few']
  datasets = client_datasets_fn(3, client_ids)
  expected_steps = step_budgets.draw(3, len(client_ids))
  assert [sum(1 for _ in d) for d in datasets] == expected_steps
  # The client with 3 examples (2 batches) repeats its data in order.
  first_batches = [b['x'].tolist()
                   for b in datasets[0].take(3).as_numpy_iterator()]
  assert first_batches == [[0.0, 1.0], [2.0], [0.0, 1.0]]
  # Same round, same budgets: a resumed run trains on the same steps.
  assert [sum(1 for _ in d) for d in client_datasets_fn(3, client_ids)
         ] == expected_steps
