"""`experiment_driver.round_inputs`: the next round's inputs are built while
the current round computes, and are the inputs a sequential build makes."""

import threading

import numpy as np
import pytest
import tensorflow as tf

from experiment_driver import round_inputs
from experiment_driver import training_loop
from fl_engine import value_transfer

_WAIT_SECONDS = 30


def test_next_round_is_built_while_the_round_computes():
  next_round_built = threading.Event()
  built_on = {}

  def build(round_num):
    built_on[round_num] = threading.get_ident()
    if round_num == 2:
      next_round_built.set()
    return f'inputs {round_num}'

  def compute(inputs):
    # Returns only if round 2 is built while this runs (else times out).
    assert next_round_built.wait(_WAIT_SECONDS), 'round 2 was not built'
    return inputs.upper()

  with round_inputs.OverlappedRoundInputs(build) as inputs:
    assert inputs.run(1, 2, compute) == 'INPUTS 1'
    assert inputs.run(2, None, str.upper) == 'INPUTS 2'
  assert built_on[1] == threading.get_ident()
  assert built_on[2] != threading.get_ident()
  assert sorted(built_on) == [1, 2]  # round 2 was not built twice


def test_next_rounds_datasets_are_serialized_with_the_build():
  datasets = {r: ['client', tf.data.Dataset.range(r)] for r in (1, 2)}
  with round_inputs.OverlappedRoundInputs(datasets.get) as inputs:
    inputs.run(1, 2, lambda _: None)
    assert datasets[2][1] in value_transfer._PREPARED_DATASETS


def test_round_not_announced_is_built_on_the_spot():
  built = []

  def build(round_num):
    built.append(round_num)
    return round_num

  with round_inputs.OverlappedRoundInputs(build) as inputs:
    assert inputs.run(1, 2, lambda x: x) == 1
    assert inputs.run(5, None, lambda x: x) == 5  # not the announced round 2
  assert built == [1, 2, 5]


def test_compute_error_is_raised_after_the_build_finishes():
  build_finished = threading.Event()
  release_build = threading.Event()

  def build(round_num):
    if round_num == 2:
      release_build.wait(_WAIT_SECONDS)
      build_finished.set()
    return round_num

  def failing_compute(_):
    release_build.set()
    raise RuntimeError('worker failed')

  with round_inputs.OverlappedRoundInputs(build) as inputs:
    with pytest.raises(RuntimeError, match='worker failed'):
      inputs.run(1, 2, failing_compute)
    assert build_finished.is_set()


def test_build_error_is_raised_after_compute():
  computed = []

  def build(round_num):
    if round_num == 2:
      raise ValueError('missing data for round 2')
    return round_num

  with round_inputs.OverlappedRoundInputs(build) as inputs:
    with pytest.raises(ValueError, match='round 2'):
      inputs.run(1, 2, computed.append)
  assert computed == [1]


def _seeded_draws(round_num):
  training_loop.seed_data_pipelines(seed=3, round_num=round_num)
  return [tf.random.uniform([4], dtype=tf.float64).numpy() for _ in range(3)]


def test_background_builds_draw_the_sequential_random_stream():
  sequential = [_seeded_draws(r) for r in (1, 2, 3)]
  overlapped = []
  with round_inputs.OverlappedRoundInputs(_seeded_draws) as inputs:
    for round_num, next_round in ((1, 2), (2, 3), (3, None)):
      overlapped.append(inputs.run(round_num, next_round, lambda d: d))
  np.testing.assert_array_equal(np.array(overlapped), np.array(sequential))
  assert not np.array_equal(sequential[0], sequential[1])
