"""GeL, guess and learn (Boukhari et al. 2024) on TFF: the public builders.

`build_gel(model_fn, base=...)` and `build_budgeted_baseline` for each row of
Table 3 (`BASES`: FedAvg, FedAvgCM, FedProx, FedNova, FedYogi), and
`StepBudgets` with `build_client_datasets_fn` for budget-limited clients.
Each runs its clients as its `execution=` says (`fl_engine.execution`).
"""

from fl_common import tf_environment  # Keras 2 for TFF, before TensorFlow  # pylint: disable=unused-import

from gel_tff.budgets import build_client_datasets_fn
from gel_tff.budgets import StepBudgets
from gel_tff.gel import BASES
from gel_tff.gel import build_budgeted_baseline
from gel_tff.gel import build_gel

__all__ = [
    'BASES',
    'StepBudgets',
    'build_budgeted_baseline',
    'build_client_datasets_fn',
    'build_gel',
]
