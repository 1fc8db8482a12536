"""Server learning-rate scaling with warmup (Charles et al. 2021, §5.1, B.7).

Given a server rate η_s tuned for a reference cohort M (50), a cohort M' uses
(eq. 3)

```
η'_s = η_s·sqrt(M'/M)   (scaling='sqrt')
η'_s = η_s·M'/M         (scaling='linear')
η'_s = η_s              (scaling='none')
```

with a linear warmup over the first W rounds (W = 100).

Round numbering and warmup. `tff.learning.optimizers.schedule_learning_rate`
calls the schedule with the number `t = 0, 1, 2, ...` of server steps already
taken, and uses the rate for the step of round `r = t + 1` (1-based, the
driver's convention). The schedule returned here gives round `r`

```
η(r) = η'_s(M_r) · min(1, r/W)     (W = 0: no warmup, factor 1)
```

so the warmup rises linearly from 0 (round "0", never applied) to η'_s:
round 1 uses η'_s/W, round W and every later round use η'_s. This is the
reading of appendix B.7 ("linearly increase the server learning rate from 0
to η'_s over the first W = 100 communication rounds"), which matches the
authors' warmup code; Section 5.1's wording ("from η_s to η'_s") would start
at the unscaled rate instead and is not what is implemented.

Dynamic cohort: `cohort_size` may be a callable `round -> M_r` (e.g.
`cohort_schedule.DoublingCohortSchedule`); then η'_s is recomputed every round
from the cohort of that round, `M_r = cohort_size(t + 1)`, and multiplied by
the same warmup factor. When the cohort doubles after warmup the rate jumps
at once to the new η'_s (there is no new warmup). Inside TFF the callable
receives a scalar int32 tensor, so it must use TensorFlow-compatible
operations (`DoublingCohortSchedule` does).
"""

from collections.abc import Callable
from typing import Union

import tensorflow as tf

SCALING_RULES = ('none', 'sqrt', 'linear')

CohortSize = Union[int, Callable[[Union[int, tf.Tensor]],
                                 Union[int, tf.Tensor]]]


def build_server_lr_schedule(
    learning_rate: float,
    *,
    scaling: str = 'none',
    cohort_size: CohortSize = 50,
    reference_cohort_size: int = 50,
    warmup_rounds: int = 100,
) -> Callable[[Union[int, tf.Tensor]], Union[float, tf.Tensor]]:
  """Returns `t -> η(t + 1)`, the server rate of step `t` (module docstring).

  Use it as
  `tff.learning.optimizers.schedule_learning_rate(server_optimizer, schedule)`.
  Called with a Python int `t >= 0` it returns a float (for logging and
  tests); with a scalar integer tensor, a float32 tensor.

  Args:
    learning_rate: η_s, the rate tuned for `reference_cohort_size` (>= 0).
    scaling: One of `SCALING_RULES`: 'none', 'sqrt' or 'linear'.
    cohort_size: The cohort M', a positive int or a callable mapping the
      1-based round number to the cohort of that round.
    reference_cohort_size: M, the cohort `learning_rate` was tuned for.
    warmup_rounds: W, rounds of linear warmup (0: none).

  Raises:
    ValueError: For a bad argument, or (when called) a negative Python `t`.
  """
  if learning_rate < 0.0:
    raise ValueError(f'learning_rate must be >= 0, got {learning_rate}.')
  if scaling not in SCALING_RULES:
    raise ValueError(
        f'scaling must be one of {SCALING_RULES}, got {scaling!r}.')
  if not isinstance(reference_cohort_size, int) or reference_cohort_size < 1:
    raise ValueError('reference_cohort_size must be a positive int, got '
                     f'{reference_cohort_size!r}.')
  if not isinstance(warmup_rounds, int) or warmup_rounds < 0:
    raise ValueError(
        f'warmup_rounds must be an int >= 0, got {warmup_rounds!r}.')
  if not callable(cohort_size) and (
      not isinstance(cohort_size, int) or cohort_size < 1):
    raise ValueError(
        'cohort_size must be a positive int or a callable, got '
        f'{cohort_size!r}.')

  def cohort_of_round(round_num: tf.Tensor) -> tf.Tensor:
    size = cohort_size(round_num) if callable(cohort_size) else cohort_size
    return tf.cast(size, tf.float64)

  def rate(step: tf.Tensor) -> tf.Tensor:
    round_num = tf.cast(step, tf.int32) + 1
    ratio = cohort_of_round(round_num) / reference_cohort_size
    if scaling == 'sqrt':
      scale = tf.sqrt(ratio)
    elif scaling == 'linear':
      scale = ratio
    else:
      scale = tf.ones_like(ratio)
    if warmup_rounds:
      warmup = tf.minimum(
          tf.constant(1.0, tf.float64),
          tf.cast(round_num, tf.float64) / warmup_rounds)
    else:
      warmup = tf.constant(1.0, tf.float64)
    return learning_rate * scale * warmup

  def schedule(step: Union[int, tf.Tensor]) -> Union[float, tf.Tensor]:
    if tf.is_tensor(step):
      return tf.cast(rate(step), tf.float32)
    if step < 0:
      raise ValueError(f'step counts server steps from 0, got {step}.')
    return float(rate(tf.constant(step)))

  return schedule
