"""The doubling cohort schedule gives the paper's cohorts, in Python and TF."""

import pytest
import tensorflow as tf

from fl_common import cohort_schedule


def test_paper_defaults_double_every_300_rounds_up_to_800():
  schedule = cohort_schedule.DoublingCohortSchedule()
  expected = {1: 50, 300: 50, 301: 100, 600: 100, 601: 200, 900: 200,
              901: 400, 1200: 400, 1201: 800, 1500: 800, 10_000: 800}
  assert {r: schedule(r) for r in expected} == expected


def test_population_caps_the_last_doubling():
  schedule = cohort_schedule.DoublingCohortSchedule(population_size=500)
  assert [schedule(r) for r in (1, 301, 601, 901, 1201, 3000)] == [
      50, 100, 200, 400, 500, 500]
  assert cohort_schedule.DoublingCohortSchedule(population_size=30)(1) == 30


def test_small_schedule_round_by_round():
  schedule = cohort_schedule.DoublingCohortSchedule(
      initial_cohort_size=3, rounds_per_doubling=2, max_cohort_size=20)
  assert [schedule(r) for r in range(1, 11)] == [3, 3, 6, 6, 12, 12, 20, 20,
                                                 20, 20]
  assert schedule.max_doublings == 3


def test_tensor_rounds_give_the_same_cohorts():
  schedule = cohort_schedule.DoublingCohortSchedule(
      initial_cohort_size=3, rounds_per_doubling=2, max_cohort_size=20)
  graph_schedule = tf.function(schedule)
  for round_num in range(1, 12):
    size = graph_schedule(tf.constant(round_num))
    assert size.dtype == tf.int32
    assert int(size) == schedule(round_num)


@pytest.mark.parametrize('kwargs, bad', [
    (dict(initial_cohort_size=0), 'initial_cohort_size'),
    (dict(rounds_per_doubling=-3), 'rounds_per_doubling'),
    (dict(max_cohort_size=2.5), 'max_cohort_size'),
    (dict(population_size=0), 'population_size'),
])
def test_bad_configuration_raises(kwargs, bad):
  with pytest.raises(ValueError, match=bad):
    cohort_schedule.DoublingCohortSchedule(**kwargs)


def test_round_zero_raises():
  with pytest.raises(ValueError, match='1-based'):
    cohort_schedule.DoublingCohortSchedule()(0)
