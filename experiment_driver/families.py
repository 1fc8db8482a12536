"""The algorithm families the driver knows, and `--algorithm`.

Each family is one module `experiment_driver/<family>_setup.py` declaring:

* `ALGORITHMS`: `--algorithm` name -> `BuildContext -> AlgorithmSetup`;
* `SHARED_FLAGS`: per algorithm, which of `flag_groups.FAMILY_DEPENDENT_FLAGS`
  it honours, and `WHY_NOT`: per algorithm, why it does not honour the rest;
* `OWN_FLAGS`: each flag the module defines (or shares with another family,
  e.g. `flag_groups.CLIENTS_PER_SHARD`) -> the algorithms that use it, and
  `unused_own_flags(algorithm, values)` for the ones that other flags'
  values make moot;
* `effective_hparams(algorithm, values)`: the values in use that the flags
  left to the family's defaults (e.g. the tuned learning rates).
"""

from types import ModuleType

from absl import flags

from experiment_driver import adabest_setup
from experiment_driver import fedopt_setup
from experiment_driver import gel_setup

FAMILIES: tuple[ModuleType, ...] = (fedopt_setup, adabest_setup, gel_setup)
FAMILY_OF: dict[str, ModuleType] = {
    name: family for family in FAMILIES for name in family.ALGORITHMS}
ALGORITHMS = {name: family.ALGORITHMS[name]
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
