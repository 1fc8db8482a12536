"""One command per paper table or figure, the papers' numbers beside ours.

    python -m reproduce gel table1 --scale=local
    python -m reproduce --list

`EXPERIMENTS` maps `(paper, name)` to an `core.Experiment`: the grids of
driver runs reproducing a table or figure at each scale (`paper`, `local`,
`smoke`) and the analysis that reads them. The papers' published numbers, each
with its source, are in `paper_numbers.csv`. The experiments live in
`gel_experiments`, `large_cohort_experiments` and `adabest_experiments`; the
library packages (`large_cohort`, `adabest_tff`, `gel_tff`) do not import
this one.
"""

from fl_common import tf_environment  # Keras 2 for TFF, before TensorFlow  # pylint: disable=unused-import

from reproduce import adabest_experiments
from reproduce import core
from reproduce import gel_experiments
from reproduce import large_cohort_experiments

# One module per paper, each declaring its `EXPERIMENTS`.
_PAPER_MODULES = (
    large_cohort_experiments,
    adabest_experiments,
    gel_experiments,
)
EXPERIMENTS: dict[tuple[str, str], core.Experiment] = {
    (e.paper, e.name): e
    for module in _PAPER_MODULES
    for e in module.EXPERIMENTS
}
PAPERS = tuple(dict.fromkeys(paper for paper, _ in EXPERIMENTS))

__all__ = ['EXPERIMENTS', 'PAPERS', 'core']
