"""The straggler model samples max_k α·N_k + Exp(mean λ·N_k), by seed."""

import numpy as np
import pytest

from fl_common import straggler


def test_matches_numpy_draws_for_the_same_seed():
  counts = [5, 40, 12, 0, 33]
  expected = np.max(1.5 * np.array(counts) + np.random.default_rng(7)
                    .exponential(scale=10.0 * np.array(counts, float)))
  assert straggler.simulated_round_time(
      counts, alpha=1.5, lam=10.0, rng=np.random.default_rng(7)) == expected


def test_deterministic_by_seed():
  counts = [3, 8, 20]
  times = [straggler.simulated_round_time(counts, 1.0, 1.0,
                                          np.random.default_rng(seed))
           for seed in (1, 1, 2)]
  assert times[0] == times[1]
  assert times[0] != times[2]


def test_no_straggling_is_the_largest_client():
  assert straggler.simulated_round_time(
      [3, 9, 4], alpha=2.0, lam=0.0, rng=np.random.default_rng(0)) == 18.0


def test_exponential_has_mean_lambda_times_examples():
  rng = np.random.default_rng(3)
  times = [straggler.simulated_round_time([10], 1.0, 2.0, rng)
           for _ in range(20_000)]
  # E[X] = α·N + λ·N = 10 + 20 (not 10 + 1/(λN)); std of the mean ≈ 0.14.
  assert np.mean(times) == pytest.approx(30.0, abs=1.0)
  assert min(times) >= 10.0


@pytest.mark.parametrize('counts, alpha, lam, bad', [
    ([], 1.0, 1.0, 'num_examples_per_client'),
    ([3, -1], 1.0, 1.0, 'example counts'),
    ([3], -1.0, 1.0, 'alpha'),
    ([3], 1.0, -0.1, 'lam'),
])
def test_bad_arguments_raise(counts, alpha, lam, bad):
  with pytest.raises(ValueError, match=bad):
    straggler.simulated_round_time(counts, alpha, lam,
                                   np.random.default_rng(0))
