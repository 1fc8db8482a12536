"""Server learning-rate scaling and warmup give the documented rates."""

import math

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fl_common import cohort_schedule
from fl_common import lr_schedules


@pytest.mark.parametrize('scaling, factor', [
    ('none', 1.0), ('sqrt', 2.0), ('linear', 4.0)])
def test_scaling_rules_without_warmup(scaling, factor):
  schedule = lr_schedules.build_server_lr_schedule(
      0.3, scaling=scaling, cohort_size=200, reference_cohort_size=50,
      warmup_rounds=0)
  for step in (0, 1, 50):
    assert schedule(step) == pytest.approx(0.3 * factor)


def test_warmup_rises_linearly_from_zero_over_w_rounds():
  schedule = lr_schedules.build_server_lr_schedule(
      0.1, scaling='sqrt', cohort_size=100, reference_cohort_size=25,
      warmup_rounds=4)
  # Scaled rate 0.1 * sqrt(4) = 0.2; step t is round t + 1.
  expected = [0.05, 0.1, 0.15, 0.2, 0.2, 0.2]
  np.testing.assert_allclose([schedule(t) for t in range(6)], expected,
                             rtol=1e-12)


def test_dynamic_cohort_rescales_every_round():
  cohorts = cohort_schedule.DoublingCohortSchedule(
      initial_cohort_size=50, rounds_per_doubling=2, max_cohort_size=800)
  schedule = lr_schedules.build_server_lr_schedule(
      1.0, scaling='sqrt', cohort_size=cohorts, reference_cohort_size=50,
      warmup_rounds=3)
  # Rounds 1..6 have cohorts 50, 50, 100, 100, 200, 200.
  expected = [1 / 3, 2 / 3, math.sqrt(2), math.sqrt(2), 2.0, 2.0]
  np.testing.assert_allclose([schedule(t) for t in range(6)], expected,
                             rtol=1e-12)


def test_drives_tff_schedule_learning_rate_step_by_step():
  cohorts = cohort_schedule.DoublingCohortSchedule(
      initial_cohort_size=10, rounds_per_doubling=1, max_cohort_size=40)
  schedule = lr_schedules.build_server_lr_schedule(
      0.5, scaling='linear', cohort_size=cohorts, reference_cohort_size=10,
      warmup_rounds=2)
  optimizer = tff.learning.optimizers.schedule_learning_rate(
      tff.learning.optimizers.build_sgdm(1.0), schedule)
  weights = [tf.constant([0.0, 0.0])]
  gradients = [tf.constant([1.0, -2.0])]
  state = optimizer.initialize([tf.TensorSpec([2], tf.float32)])
  for step in range(4):
    previous = weights[0].numpy()
    state, weights = optimizer.next(state, weights, gradients)
    # Round step+1: cohort 10 * 2**step (capped at 40), warmup min(1, r/2).
    np.testing.assert_allclose(previous - weights[0].numpy(),
                               schedule(step) * np.array([1.0, -2.0]),
                               rtol=1e-6)
  assert [schedule(t) for t in range(4)] == pytest.approx(
      [0.25, 1.0, 2.0, 2.0])


@pytest.mark.parametrize('kwargs, bad', [
    (dict(learning_rate=-0.1), 'learning_rate'),
    (dict(learning_rate=0.1, scaling='cubic'), 'scaling'),
    (dict(learning_rate=0.1, cohort_size=0), 'cohort_size'),
    (dict(learning_rate=0.1, reference_cohort_size=0),
     'reference_cohort_size'),
    (dict(learning_rate=0.1, warmup_rounds=-1), 'warmup_rounds'),
])
def test_bad_arguments_raise(kwargs, bad):
  with pytest.raises(ValueError, match=bad):
    lr_schedules.build_server_lr_schedule(**kwargs)


def test_negative_step_raises():
  schedule = lr_schedules.build_server_lr_schedule(0.1)
  with pytest.raises(ValueError, match='step'):
    schedule(-1)
