"""The shared absl flags of `run_experiment.py`, grouped by concern.

Algorithm families add their own flags in `experiment_driver/<family>_setup.py`
and `--algorithm` is defined with the families (`experiment_driver.families`).
Which of these flags a run uses depends on its task, algorithm, optimizers and
runtime; `experiment_driver.flag_rules` refuses the others. Learning rates
left unset take the tuned defaults of the selected algorithm family.
"""

import math
from collections.abc import Mapping
from typing import Any, NamedTuple, Optional

from absl import flags

from fl_common import optimizers
import tasks

# Task and data.
TASK = flags.DEFINE_enum(
    'task', 'synthetic', tasks.TASK_NAMES,
    'Task: the large-cohort paper\'s cifar100, emnist, shakespeare,'
    ' stackoverflow; GeL\'s synthetic (LEAF); AdaBest\'s partitioned'
    ' emnist_l, cifar10, cifar100_partitioned, synthetic_partitioned, and'
    ' digits (scikit-learn\'s bundled images, offline).')
DATA_DIR = flags.DEFINE_string(
    'data_dir', None,
    'Directory holding the files TFF/TFDS would have cached; no network is'
    ' used when they are there.')
OFFLINE = flags.DEFINE_bool(
    'offline', False,
    'Never download: a missing data file is an error naming it (also'
    ' FL_PAPERS_OFFLINE=1). Default: TFF datasets are fetched into --data_dir'
    ' (or ~/.tff) on first use, from FL_PAPERS_DATA_MIRROR if set.')
PROGRESS = flags.DEFINE_bool(
    'progress', True,
    'Show a progress bar (bytes, rate, ETA) while downloading data, on a'
    ' terminal.')
USE_SYNTHETIC_DATA = flags.DEFINE_bool(
    'use_synthetic_data', False,
    "Use TFF's small synthetic version of the task's data (no download).")
TRAIN_BATCH_SIZE = flags.DEFINE_integer(
    'train_batch_size', None, 'Client batch size; default: the task\'s.',
    lower_bound=1)
EVAL_BATCH_SIZE = flags.DEFINE_integer(
    'eval_batch_size', 64, 'Batch size for evaluation.', lower_bound=1)
CLIENT_EPOCHS = flags.DEFINE_integer(
    'client_epochs', None,
    "Local epochs per round (E); default: the task's (1; AdaBest's 5 for the"
    ' partitioned tasks).', lower_bound=1)
MAX_ELEMENTS_PER_CLIENT = flags.DEFINE_integer(
    'max_elements_per_client', None,
    'Use at most this many examples of each client (default: all).',
    lower_bound=1)
VALIDATION_FRACTION = flags.DEFINE_float(
    'validation_fraction', 0.2,
    'For tasks without a validation split, the fraction of training clients'
    ' held out for validation (SPEC.md: 80/20).', lower_bound=0.0,
    upper_bound=0.9)


def _define_task_flag(spec: tasks.TaskFlag) -> flags.FlagHolder:
  """Defines one task's own flag from its `tasks.TaskFlag`."""
  if spec.type is str:
    holder = flags.DEFINE_enum(spec.name, spec.flag_default,
                               list(spec.choices), spec.help)
  else:
    define = (flags.DEFINE_integer if spec.type is int else
              flags.DEFINE_float)
    holder = define(spec.name, spec.flag_default, spec.help,
                    lower_bound=spec.lower_bound,
                    upper_bound=spec.upper_bound)
  if spec.greater_than is not None:
    flags.register_validator(
        spec.name, lambda v, bound=spec.greater_than: v is None or v > bound,
        message=f'must be > {spec.greater_than:g}')
  return holder


# The tasks' own flags (LEAF Synthetic's generator, the partitioned tasks'
# partition, digits' model, ...), derived from the task records
# (`tasks.TASK_FLAGS`); `flag_rules` refuses them for the other tasks.
TASK_FLAGS = {name: _define_task_flag(spec)
              for name, spec in tasks.TASK_FLAGS.items()}

# Process (`--algorithm` is defined in `experiment_driver.families`).
UNIFORM_WEIGHTING = flags.DEFINE_bool(
    'uniform_weighting', False,
    'Weight client updates equally instead of by number of examples.')
CLIPPING = flags.DEFINE_bool(
    'clipping', None,
    'Adaptive clipping of client updates (Andrew et al. 2019; q=0.8, rho_1=1,'
    ' eta_a=0.2, no noise); default: on, as the large-cohort paper runs every'
    ' experiment after Section 3.1, except for GeL\'s algorithms, whose paper'
    ' clips nothing.')


def clipping_default(algorithm: str) -> bool:
  """`--clipping` left unset: off for GeL's algorithms, else on."""
  return not algorithm.endswith(('_gel', '_budgeted'))


def clipping_enabled(algorithm: str, value) -> bool:
  return clipping_default(algorithm) if value is None else bool(value)
ZEROING = flags.DEFINE_bool(
    'zeroing', False, 'Adaptive zeroing of outlier client updates.')


# Optimizers: the client and the server have the same flags, derived from
# the optimizer registry (`fl_common.optimizers`): the optimizer, its
# learning rate and one flag per hyperparameter any optimizer takes.
class OptimizerFlags(NamedTuple):
  """The flags of one optimizer (client or server)."""

  optimizer: flags.FlagHolder[str]
  learning_rate: flags.FlagHolder[Optional[float]]
  hyperparameters: dict[str, flags.FlagHolder[float]]

  def hyperparameter_values(self) -> dict[str, float]:
    """`build_optimizer`'s keyword arguments: every hyperparameter flag."""
    return {name: holder.value
            for name, holder in self.hyperparameters.items()}


def _define_optimizer_flags(role: str, optimizer_help: str,
                            learning_rate_help: str) -> OptimizerFlags:
  """Defines `--<role>_optimizer`, `--<role>_learning_rate` and
  `--<role>_<hyperparameter>` for each of the registry's hyperparameters."""
  hyperparameters = {}
  for name, spec in optimizers.HYPERPARAMETERS_SPECS.items():
    users = ', '.join(optimizer for optimizer, entry
                      in optimizers.OPTIMIZERS.items()
                      if name in entry.hyperparameters)
    bounds = dict(lower_bound=0.0)
    if spec.below_one:
      bounds['upper_bound'] = 1.0
    hyperparameters[name] = flags.DEFINE_float(
        f'{role}_{name}', spec.default,
        f'{role.capitalize()} {name} {spec.rule} ({users}).', **bounds)
    if spec.below_one:  # absl's upper bound is inclusive.
      flags.register_validator(f'{role}_{name}', lambda v: v < 1.0,
                               message='must be < 1')
  learning_rate = flags.DEFINE_float(
      f'{role}_learning_rate', None, learning_rate_help + ' (> 0)')
  flags.register_validator(
      f'{role}_learning_rate', lambda v: v is None or v > 0,
      message='a learning rate must be a finite number > 0')
  return OptimizerFlags(
      optimizer=flags.DEFINE_enum(
          f'{role}_optimizer', 'sgd', optimizers.OPTIMIZER_NAMES,
          optimizer_help),
      learning_rate=learning_rate,
      hyperparameters=hyperparameters)


def optimizer_flag_names(role: str) -> frozenset[str]:
  """The flags of `--<role>_optimizer`, by name."""
  return frozenset({f'{role}_optimizer', f'{role}_learning_rate',
                    *(f'{role}_{name}'
                      for name in optimizers.HYPERPARAMETERS_SPECS)})


CLIENT = _define_optimizer_flags(
    'client', 'Client optimizer.',
    'Client learning rate; default: the tuned rate for task and server'
    ' optimizer.')
SERVER = _define_optimizer_flags(
    'server',
    'Server optimizer: ' + ', '.join(
        f'{name} = {entry.server_algorithm}'
        for name, entry in optimizers.OPTIMIZERS.items()) + '.',
    'Server learning rate; default: the tuned rate for task and optimizer.')
CLIENT_OPTIMIZER, CLIENT_LEARNING_RATE = CLIENT.optimizer, CLIENT.learning_rate
SERVER_OPTIMIZER, SERVER_LEARNING_RATE = SERVER.optimizer, SERVER.learning_rate

# Cohort.
DEFAULT_CLIENTS_PER_ROUND = 10
CLIENTS_PER_ROUND = flags.DEFINE_integer(
    'clients_per_round', None,
    'Cohort size M (the starting size with --rounds_to_double_cohort);'
    f' default: {DEFAULT_CLIENTS_PER_ROUND}, or all training clients if there'
    ' are fewer. A larger value than the population is an error.',
    lower_bound=1)
TOTAL_ROUNDS = flags.DEFINE_integer(
    'total_rounds', 100, 'Number of training rounds.', lower_bound=1,
    upper_bound=1_000_000)

# Large-cohort techniques (Charles et al. 2021, SPEC.md §1).
SERVER_LR_SCALING = flags.DEFINE_enum(
    'server_lr_scaling', 'none', ['none', 'sqrt', 'linear'],
    'Scale the server learning rate for the cohort M\' relative to'
    ' --reference_cohort_size M: sqrt(M\'/M) or M\'/M, with linear warmup'
    ' over --server_warmup_rounds (no warmup with none).')
REFERENCE_COHORT_SIZE = flags.DEFINE_integer(
    'reference_cohort_size', 50,
    'The cohort size the server learning rate was tuned for.', lower_bound=1)
SERVER_WARMUP_ROUNDS = flags.DEFINE_integer(
    'server_warmup_rounds', 100,
    'Rounds of linear server learning-rate warmup when scaling.',
    lower_bound=0)
ROUNDS_TO_DOUBLE_COHORT = flags.DEFINE_integer(
    'rounds_to_double_cohort', 0,
    'Dynamic cohort: double the cohort every this many rounds, starting from'
    ' --clients_per_round (0: fixed cohort).', lower_bound=0)
MAX_COHORT_SIZE = flags.DEFINE_integer(
    'max_cohort_size', 800,
    'Cap of the dynamic cohort (also capped by the population).',
    lower_bound=1)
NORMALIZE_SERVER_UPDATE = flags.DEFINE_bool(
    'normalize_server_update', False,
    'Normalized FedAvg: the server steps along Delta/||Delta||_2.')
STRAGGLER_ALPHA = flags.DEFINE_float(
    'straggler_alpha', 1.0,
    'Straggler model: seconds per example of a client (appendix B.5).',
    lower_bound=0.0)
STRAGGLER_LAMBDA = flags.DEFINE_float(
    'straggler_lambda', None,
    'Straggler model: mean extra time per example (Exp); when set, each round'
    ' reports simulated_round_time = max over the cohort of'
    ' alpha*N_k + Exp(lambda*N_k).', lower_bound=0.0)

# Evaluation.
ROUNDS_PER_EVAL = flags.DEFINE_integer(
    'rounds_per_eval', 10, 'Evaluate every this many rounds (and at the end).',
    lower_bound=1)
MAX_EVAL_CLIENTS = flags.DEFINE_integer(
    'max_eval_clients', 1000,
    'Evaluate on at most this many validation/test clients (a fixed, seeded'
    ' sample); 0 means all.', lower_bound=0)
PER_CLIENT_EVAL = flags.DEFINE_bool(
    'per_client_eval', True,
    'Score each validation/test client on its own, for the test percentiles'
    ' of per-client accuracy (large-cohort paper, Section 3.4).'
    ' --noper_client_eval scores each split\'s examples pooled, in batches'
    ' of 256: the same example-weighted metrics (test/num_batches aside), no'
    ' percentiles, and no loop step per client, which is most of an'
    ' evaluation\'s time where clients are many and small.')
COHORT_ACCURACY = flags.DEFINE_bool(
    'cohort_accuracy', False,
    'Before each round, evaluate the server model on the round\'s cohort'
    ' (their training data, read as evaluation data are): the cohort/'
    ' columns, whose cohort/accuracy is the catastrophic-failure detector on'
    ' the server model (large-cohort paper, Section 3.1), where'
    ' train/accuracy averages over local training. A forward pass over the'
    ' cohort\'s data per round, timed apart (cohort_eval_time_sec).')

# Output.
ROOT_OUTPUT_DIR = flags.DEFINE_string(
    'root_output_dir', '/tmp/fl_papers', 'Root directory of run directories.')
EXPERIMENT_NAME = flags.DEFINE_string(
    'experiment_name', None,
    'Run directory name under --root_output_dir; default: built from task,'
    ' algorithm, optimizers, cohort size and seed. Rerunning a command resumes'
    ' its run.')
ROUNDS_PER_CHECKPOINT = flags.DEFINE_integer(
    'rounds_per_checkpoint', 50,
    'Save program state every this many rounds (and after the last). The'
    ' default is the authors\' training loops\' (google-research/federated);'
    ' TFF writes a checkpoint as a SavedModel, 0.05-0.2 s each, which at every'
    ' 10 rounds was a fifth of a small-model run.',
    lower_bound=1)
CHECKPOINTS_TO_KEEP = flags.DEFINE_integer(
    'checkpoints_to_keep', 3,
    'Keep the last this many checkpoints (and the first), with the stateful'
    ' clients\' states as of each: deleting a corrupt latest checkpoint'
    ' resumes from the one before.', lower_bound=1)

# Runtime and seed.
RUNTIME = flags.DEFINE_enum(
    'runtime', 'in_process', ['in_process', 'worker'],
    'Where rounds run on this machine: in_process, in the driver\'s own'
    ' TensorFlow, on its GPUs if any, else its CPU cores (--devices); worker,'
    ' in TFF\'s local worker_binary (TFF\'s own C++ runtime, CPU only). See'
    ' docs/runtime.md.')
DEVICES = flags.DEFINE_list(
    'devices', [],
    'With --runtime=in_process: the TensorFlow devices to compute on, e.g.'
    ' GPU:0,GPU:1 or CPU:0. Each round\'s clients are spread over them, the'
    ' server update runs on the first. Default: every visible GPU, else the'
    ' CPU.')
MAX_CONCURRENT_CLIENTS = flags.DEFINE_integer(
    'max_concurrent_clients', None,
    'With --runtime=worker: how many clients the local TFF worker trains at'
    ' once, sharing its cores among them; default: one per core;'
    ' non-positive: no limit.')
MAX_CLIENTS_PER_CALL = flags.DEFINE_integer(
    'max_clients_per_call', 0,
    'Run each round\'s cohort in slices of at most this many clients and'
    ' merge their aggregates: memory then grows with this number, not the'
    ' cohort (several model-sized values per client of a call, ~23 GB for 200'
    ' clients of the Stack Overflow LSTM on the worker). 0: the whole cohort'
    ' in one call.', lower_bound=0)
CLIENTS_PER_SHARD = flags.DEFINE_integer(
    'clients_per_shard', None,
    'Real clients trained in one call of the client computation'
    ' (fl_engine.fused: a shard, one TensorFlow graph); 1 is one call per'
    ' client. Default: one shard per core of each worker (not with'
    ' --zeroing).',
    lower_bound=1)
LANES = flags.DEFINE_integer(
    'lanes', None,
    'On shards: how many of a shard\'s clients train side by side,'
    ' vectorized (fl_engine.lanes); 1 is one after the other. Default: 64'
    ' for a model of at most 10,000 weights whose forward pass vectorizes,'
    ' in shards of at least 32 clients, else 1.',
    lower_bound=1)
WORKER_ADDRESSES = flags.DEFINE_list(
    'worker_addresses', [],
    'host:port of TFF worker_binary executor services (one per machine);'
    ' with it, each round\'s cohort is split among these workers instead of'
    ' the local runtime (see README, "More than one machine").')
SEED = flags.DEFINE_integer(
    'seed', 0, 'Seed of client sampling, data splits and model init.')

# Flags whose use depends on the algorithm family (each family's
# `Family.shared_flags` says which it honours); every other shared flag is used by
# every algorithm, subject to `flag_rules` (task, optimizer, runtime).
CLIENT_OPTIMIZER_FLAGS = optimizer_flag_names('client')
SERVER_OPTIMIZER_FLAGS = optimizer_flag_names('server')
SERVER_LR_SCALING_FLAGS = frozenset({
    'server_lr_scaling', 'reference_cohort_size', 'server_warmup_rounds'})
AGGREGATOR_FLAGS = frozenset({
    'clipping', 'zeroing', 'normalize_server_update'})
FAMILY_DEPENDENT_FLAGS = (
    CLIENT_OPTIMIZER_FLAGS | SERVER_OPTIMIZER_FLAGS | SERVER_LR_SCALING_FLAGS
    | AGGREGATOR_FLAGS
    | {'uniform_weighting', 'train_batch_size', 'client_epochs'})
# Flags that change where or how fast a run goes, not what it computes: they
# are not recorded in hparams.json, and a run may be resumed with other
# values of these. `cohort_accuracy` adds columns (from the rounds run with
# it), `per_client_eval` the test percentiles; both leave the model's
# trajectory as it is.
NOT_HPARAMS = frozenset({
    'root_output_dir', 'experiment_name', 'total_rounds',
    'rounds_per_checkpoint', 'checkpoints_to_keep', 'runtime', 'devices',
    'max_concurrent_clients',
    'max_clients_per_call', 'lanes',
    'worker_addresses', 'target_accuracy', 'target_metric', 'baseline_run_dir',
    'offline', 'progress', 'cohort_accuracy', 'per_client_eval',
})


FLOAT32_MAX = 3.4028234663852886e+38


def is_finite_or_none(value) -> bool:
  """None, or finite once in float32 (the dtype the computations use)."""
  return value is None or (math.isfinite(value) and
                           abs(value) <= FLOAT32_MAX)



def shard_flag_conflicts(values: Mapping[str, Any]) -> dict[str, str]:
  """`--clients_per_shard` and `--lanes` are moot (with the reason) when the
  aggregator flags choose an aggregator that shards cannot compute, and
  `--lanes` without shards."""
  if values['zeroing']:
    reason = ('cannot be fused with --zeroing (adaptive zeroing is not part'
              ' of the fused mean)')
    return {'clients_per_shard': reason, 'lanes': reason}
  if values['clients_per_shard'] == 1:
    return {'lanes': 'needs shards of clients, not --clients_per_shard=1'}
  return {}
