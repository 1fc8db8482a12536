"""Builds the next round's client datasets while the current round computes.

Building a round's client datasets is Python and TensorFlow work in the
driver: each client's `tf.data` pipeline is constructed (its `map` functions
traced) and then serialized for the worker, ~2.5 ms per client for a batched
in-memory dataset and ~5 ms for the EMNIST task's pipeline (shuffle, repeat,
map, batch) on this 2-core machine. Done between rounds, it is time the
worker sits idle: 4-5 % of an EMNIST CNN round, 10 % with the task's
pipeline. While a round computes, the driver only waits for the worker, so
`OverlappedRoundInputs` builds the next round's inputs then, on a background
thread, and serializes the datasets among them for the worker
(`value_transfer.prepare_datasets`).

The inputs stay exactly those built in sequence: a round's inputs depend on
its round number only (`training_loop.seed_data_pipelines` seeds TF's global
random stream by round; client sampling and GeL's budgets are seeded by
round), and while the background thread builds, the driver's own thread only
sends the current round to the worker and creates no random op.
"""

import concurrent.futures
from collections.abc import Callable
from typing import Generic, Optional, TypeVar

from fl_engine import value_transfer

Inputs = TypeVar('Inputs')
Result = TypeVar('Result')


class OverlappedRoundInputs(Generic[Inputs]):
  """Runs rounds, building the next round's inputs during the current one.

  `run(round_num, next_round_num, compute)` returns
  `compute(build_fn(round_num))`; while `compute` runs, `build_fn(
  next_round_num)` runs on a background thread (and the datasets it returns
  are serialized for the worker there), and `run` returns once both
  are done: the time a round takes includes whatever part of the next build
  the computation did not hide, and no build runs while the caller does
  other work (evaluation, checkpoints). A use as a context manager stops the
  background thread on exit.
  """

  def __init__(self, build_fn: Callable[[int], Inputs]):
    self._build_fn = build_fn
    self._pool = concurrent.futures.ThreadPoolExecutor(
        max_workers=1, thread_name_prefix='next-round-inputs')
    self._built: Optional[tuple[int, Inputs]] = None

  def run(self, round_num: int, next_round_num: Optional[int],
          compute: Callable[[Inputs], Result]) -> Result:
    """`compute` on round `round_num`'s inputs, building `next_round_num`'s
    meanwhile (none if `None`).

    The inputs of `round_num` are the ones built during the previous call if
    it named this round, and are built now otherwise. An error of `compute`
    is raised once the background build has finished; an error of the build
    is raised after `compute` returns.
    """
    if self._built is not None and self._built[0] == round_num:
      inputs = self._built[1]
    else:
      inputs = self._build(round_num)
    self._built = None
    pending = (None if next_round_num is None else
               self._pool.submit(self._build, next_round_num))
    try:
      result = compute(inputs)
    except BaseException:
      if pending is not None:
        concurrent.futures.wait([pending])
      raise
    if pending is not None:
      self._built = (next_round_num, pending.result())
    return result

  def _build(self, round_num: int) -> Inputs:
    inputs = self._build_fn(round_num)
    value_transfer.prepare_datasets(inputs)
    return inputs

  def close(self) -> None:
    """Waits for a build in flight and stops the background thread."""
    self._pool.shutdown(wait=True)

  def __enter__(self) -> 'OverlappedRoundInputs[Inputs]':
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()
