"""The algorithm families the driver knows, and `--algorithm`.

Each family is one module `experiment_driver/<family>_setup.py` declaring
its flags and one `algorithm_setup.Family` record, `FAMILY`: its algorithms
(`--algorithm` name -> `BuildContext -> AlgorithmSetup`), which shared flags
each honours and why not the rest, its own flags and their users, and the
values its defaults give unset flags (`effective_hparams`). A new family is
one more module and one more entry in `FAMILIES`.
"""

from absl import flags

from experiment_driver import adabest_setup
from experiment_driver import algorithm_setup
from experiment_driver import fedopt_setup
from experiment_driver import gel_setup

FAMILIES: tuple[algorithm_setup.Family, ...] = (
    fedopt_setup.FAMILY,
    adabest_setup.FAMILY,
    gel_setup.FAMILY,
)
FAMILY_OF: dict[str, algorithm_setup.Family] = {
    name: family for family in FAMILIES for name in family.algorithms}
ALGORITHMS = {name: family.algorithms[name]
              for name, family in FAMILY_OF.items()}
ALGORITHM_NAMES = tuple(ALGORITHMS)

ALGORITHM = flags.DEFINE_enum(
    'algorithm', 'fedopt', ALGORITHM_NAMES,
    'Learning process. Large-cohort paper: fedopt (FedAvg/FedAvgM/FedAdagrad/'
    'FedAdam/FedYogi/FedLARS/FedLamb by --server_optimizer), fedsgd. AdaBest'
    ' paper: adabest, feddyn, scaffold. GeL paper (Table 3): <base>_gel and'
    ' <base>_budgeted for base in fedavg, fedavgcm, fedprox, fednova,'
    ' fedyogi.')
flags.DEFINE_alias('iterative_process', 'algorithm')
# Other names of the flags above (alias -> flag): not flags of their own.
ALIASES = {'iterative_process': 'algorithm'}
