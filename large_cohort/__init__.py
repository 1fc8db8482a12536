"""Large-cohort training (Charles et al. 2021) on TFF: the public builders.

`build_fedopt` (FedAvg, FedAvgM, FedAdagrad, FedAdam, FedYogi, FedLARS,
FedLamb by its server optimizer), `build_fedsgd`, `build_normalized_fed_avg`;
each runs its clients as its `execution=` says (`fl_engine.execution`,
composed by `fl_engine.compose`).
The optimizers by name (`build_optimizer`), LARS/LAMB as
`tff.learning.optimizers` and `build_server_lr_schedule` (sqrt/linear
scaling with warmup) are the library's (`fl_common`), for every family;
they are re-exported here, where the paper introduces them.
"""

from fl_common import tf_environment  # Keras 2 for TFF, before TensorFlow  # pylint: disable=unused-import

from large_cohort.fedopt import build_fedopt
from large_cohort.fedopt import build_fedsgd
from fl_common.lamb import build_lamb
from fl_common.lars import build_lars
from fl_common.lr_schedules import build_server_lr_schedule
from large_cohort.normalized_update import build_normalized_fed_avg
from fl_common.optimizers import build_optimizer
from fl_common.optimizers import OPTIMIZER_NAMES

__all__ = [
    'OPTIMIZER_NAMES',
    'build_fedopt',
    'build_fedsgd',
    'build_lamb',
    'build_lars',
    'build_normalized_fed_avg',
    'build_optimizer',
    'build_server_lr_schedule',
]
