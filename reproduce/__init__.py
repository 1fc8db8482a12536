"""One command per paper table or figure, the papers' numbers beside ours.

    python -m reproduce gel table1 --scale=local
    python -m reproduce --list

`EXPERIMENTS` maps `(paper, name)` to an `core.Experiment`: the grids of
driver runs reproducing a table or figure at each scale (`paper`, `local`,
`smoke`) and the analysis that reads them. The papers' published numbers, each
with its source, are in `paper_numbers.csv`. The experiments live in
`gel_experiments`, `large_cohort_experiments` and `adabest_experiments`;
the sweep of driver runs (`sweep`), the reading of run directories
(`analysis`), the figures (`plots`) and the reports (`core`) are here too,
on the experiment side: neither the library (`fl_common`) nor the paper
packages import this one.
"""

from fl_common import tf_environment  # Keras 2 for TFF, before TensorFlow  # pylint: disable=unused-import

import importlib
from typing import Any

# One module per paper, each declaring its `EXPERIMENTS`. They are imported
# on first use of `EXPERIMENTS` or `PAPERS`, so that the experiment side's
# tools (`python -m reproduce.plots`, `reproduce.sweep`) start without them.
_PAPER_MODULES = (
    'large_cohort_experiments',
    'adabest_experiments',
    'gel_experiments',
)

__all__ = ['EXPERIMENTS', 'PAPERS', 'core']


def __getattr__(name: str) -> Any:
  """`EXPERIMENTS`: `(paper, name)` -> `core.Experiment`; `PAPERS`."""
  if name in ('EXPERIMENTS', 'PAPERS'):
    experiments = {
        (e.paper, e.name): e
        for module in _PAPER_MODULES
        for e in importlib.import_module(f'reproduce.{module}').EXPERIMENTS}
    globals().update(
        EXPERIMENTS=experiments,
        PAPERS=tuple(dict.fromkeys(paper for paper, _ in experiments)))
    return globals()[name]
  if name == 'core':
    return importlib.import_module('reproduce.core')
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
