"""Dynamic cohort size (Charles et al. 2021, Section 5.3 and appendix B.8).

"We start with an initial cohort size of M = 50 and double the size every 300
rounds up to M = 800 (or the maximum population size if smaller)." With
1-based round numbers `r` (the driver's convention) and period `N`:

```
M(r) = min(M0 · 2^⌊(r − 1)/N⌋, cap),   cap = min(max_cohort_size, population)
```

so rounds 1..N use `M0`, rounds N+1..2N use `2·M0`, and so on; with the
defaults over 1,500 rounds: 50, 100, 200, 400, 800 (four doublings). When a
doubling would exceed the cap, the cap itself is used (e.g. CIFAR-100's 500
training clients: 50, 100, 200, 400, 500).

`DoublingCohortSchedule` is a callable `round_num -> cohort size`. It accepts a
Python int (returns an int, for client sampling) or a scalar integer
`tf.Tensor` (returns an int32 tensor, so that a learning-rate schedule run
inside a TFF computation can scale by the cohort of that round; see
`lr_schedules`).
"""

import dataclasses
from typing import Optional, Union

import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class DoublingCohortSchedule:
  """Cohort size that doubles every `rounds_per_doubling` rounds, capped.

  Attributes:
    initial_cohort_size: M0, the cohort of rounds 1..rounds_per_doubling.
    rounds_per_doubling: N, rounds between doublings.
    max_cohort_size: The largest cohort.
    population_size: The number of training clients, another cap (`None`:
      no population cap).
  """

  initial_cohort_size: int = 50
  rounds_per_doubling: int = 300
  max_cohort_size: int = 800
  population_size: Optional[int] = None

  def __post_init__(self):
    for name in ('initial_cohort_size', 'rounds_per_doubling',
                 'max_cohort_size'):
      value = getattr(self, name)
      if not isinstance(value, int) or value < 1:
        raise ValueError(f'{name} must be a positive int, got {value!r}.')
    if self.population_size is not None and (
        not isinstance(self.population_size, int) or self.population_size < 1):
      raise ValueError(
          'population_size must be None or a positive int, got '
          f'{self.population_size!r}.')
    if self.initial_cohort_size > self.max_cohort_size:
      raise ValueError(
          f'initial_cohort_size={self.initial_cohort_size} is above'
          f' max_cohort_size={self.max_cohort_size}: the schedule would never'
          ' give the initial cohort.')

  @property
  def cap(self) -> int:
    """The largest cohort the schedule ever returns."""
    if self.population_size is None:
      return self.max_cohort_size
    return min(self.max_cohort_size, self.population_size)

  @property
  def max_doublings(self) -> int:
    """Doublings after which the cap is reached (no further growth)."""
    doublings = 0
    while self.initial_cohort_size * 2**doublings < self.cap:
      doublings += 1
    return doublings

  def __call__(self, round_num: Union[int, tf.Tensor]) -> Union[int, tf.Tensor]:
    """The cohort size of 1-based round `round_num`.

    Args:
      round_num: A Python int >= 1, or a scalar integer tensor (values below
        1 are treated as round 1).

    Returns:
      An int for a Python `round_num`, an int32 tensor for a tensor.

    Raises:
      ValueError: If a Python `round_num` is less than 1.
    """
    if not tf.is_tensor(round_num):
      if round_num < 1:
        raise ValueError(f'round_num is 1-based, got {round_num}.')
      doublings = min((round_num - 1) // self.rounds_per_doubling,
                      self.max_doublings)
      return min(self.initial_cohort_size * 2**doublings, self.cap)
    round_num = tf.cast(round_num, tf.int32)
    doublings = tf.clip_by_value((round_num - 1) // self.rounds_per_doubling,
                                 0, self.max_doublings)
    return tf.minimum(self.initial_cohort_size * 2**doublings, self.cap)
