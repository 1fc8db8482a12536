"""Which flags a run uses: the others are refused, only these are recorded.

The original large-cohort code refused the flags of an unselected optimizer
("were the flags set by mistake?"). Here the same holds for every flag of the
driver: a flag given on the command line that the selected task, algorithm,
optimizer or runtime does not use stops the run before any work, with one
line naming it and why. `hparams.json` records the flags in use and the
values the run derived from them (e.g. tuned learning rates), nothing else.
"""

from collections.abc import Mapping
from typing import Any

from absl import flags

from experiment_driver import families
from experiment_driver import flag_groups as f
from fl_common import optimizers
import tasks

_DRIVER_MODULE = 'experiment_driver'


class UnusedFlagError(ValueError):
  """A flag was set that the run would not use."""


def driver_flags(flag_values: flags.FlagValues = flags.FLAGS
                 ) -> dict[str, flags.Flag]:
  """The flags defined by the driver's modules, by name (no aliases)."""
  return {flag.name: flag
          for module, module_flags in flag_values.flags_by_module_dict().items()
          if _DRIVER_MODULE in module for flag in module_flags
          if flag.name not in families.ALIASES}


def values_of(flag_values: flags.FlagValues = flags.FLAGS) -> dict[str, Any]:
  return {name: flag.value for name, flag in driver_flags(flag_values).items()}


def unused_flags(values: Mapping[str, Any]) -> dict[str, str]:
  """The driver's flags this run does not use, each with the reason.

  Args:
    values: Every driver flag's value, by name (`values_of()`).
  """
  why: dict[str, str] = {}
  algorithm, task_name = values['algorithm'], values['task']
  task = tasks.TASKS[task_name]
  family = families.FAMILY_OF[algorithm]

  honoured = family.shared_flags[algorithm]
  for name in f.FAMILY_DEPENDENT_FLAGS - honoured:
    why[name] = (f'is not used by --algorithm={algorithm}:'
                 f' {family.why_not[algorithm]}')
  users_of: dict[str, set[str]] = {}
  for other in families.FAMILIES:  # A flag may be used by several families.
    for name, users in other.own_flags.items():
      users_of.setdefault(name, set()).update(users)
  for name, users in users_of.items():
    if algorithm not in users:
      why.setdefault(name, 'is only used by --algorithm='
                     + '/'.join(sorted(users)))
  for name, reason in family.unused_own_flags(algorithm, values).items():
    why.setdefault(name, reason)
  # How the clients run (shards, lanes) is the driver's, for every family
  # (`algorithm_setup.realize`).
  for name, reason in f.shard_flag_conflicts(values).items():
    why.setdefault(name, reason)

  for role in ('client', 'server'):
    optimizer = values[f'{role}_optimizer']
    if f'{role}_optimizer' not in honoured:
      continue
    for name in optimizers.HYPERPARAMETERS_SPECS:
      if name not in optimizers.HYPERPARAMETERS[optimizer]:
        why.setdefault(f'{role}_{name}',
                       f'is not a hyperparameter of --{role}_optimizer='
                       f'{optimizer}')

  if task.partitioned:
    for name in ('validation_fraction', 'max_elements_per_client'):
      why.setdefault(name, f'is not used by the partitioned --task={task_name}'
                     ' (10 % validation clients, whole client datasets)')
  for name, reason in unused_task_flags(task_name, values).items():
    why.setdefault(name, reason)
  if not task.reads_files:
    for name in ('data_dir', 'use_synthetic_data'):
      why.setdefault(name, f'is not used by --task={task_name}, whose data'
                     ' are generated in memory')
  elif values['use_synthetic_data']:
    why.setdefault('data_dir', 'is not used with --use_synthetic_data')
  if not task.downloads or values['use_synthetic_data']:
    for name in ('offline', 'progress'):
      why.setdefault(name, 'is only used where data are downloaded ('
                     + ', '.join(n for n, r in tasks.TASKS.items()
                                 if r.downloads)
                     + ' without --use_synthetic_data)')

  conditions = (
      (values['server_lr_scaling'] == 'none',
       ('reference_cohort_size', 'server_warmup_rounds'),
       'needs --server_lr_scaling=sqrt or linear'),
      (not values['rounds_to_double_cohort'], ('max_cohort_size',),
       'needs --rounds_to_double_cohort > 0'),
      (values['straggler_lambda'] is None, ('straggler_alpha',),
       'needs --straggler_lambda'),
      (bool(values['worker_addresses']),
       ('max_concurrent_clients', 'max_clients_per_call', 'runtime',
        'devices'),
       'sets the local runtime, which --worker_addresses replaces'),
      (values['runtime'] != 'worker', ('max_concurrent_clients',),
       'needs --runtime=worker (the in-process runtime runs one client per'
       ' core, or two per GPU)'),
      (values['runtime'] != 'in_process', ('devices',),
       'needs --runtime=in_process (TFF\'s worker runs on the CPU only)'),
  )
  for unused, names, reason in conditions:
    if unused:
      for name in names:
        why.setdefault(name, reason)
  return why


def unused_task_flags(task_name: str,
                      values: Mapping[str, Any]) -> dict[str, str]:
  """The tasks' own flags (`tasks.TASK_FLAGS`) this task does not use: those
  of other tasks, and those whose `needs` is unset."""
  why = {}
  own = {flag.name: flag for flag in tasks.TASKS[task_name].flags}
  for name in tasks.TASK_FLAGS:
    if name not in own:
      users = [t for t, record in tasks.TASKS.items()
               if any(flag.name == name for flag in record.flags)]
      why[name] = 'is only used by --task=' + '/'.join(users)
    elif own[name].needs and not values[own[name].needs[0]]:
      why[name] = own[name].needs[1]
  return why


class ConflictingFlagsError(ValueError):
  """Two flags were given whose values cannot both hold."""


def conflicts(flag_values: flags.FlagValues = flags.FLAGS) -> list[str]:
  """Flags given together that would override one another, each named."""
  found = []
  for alias, name in families.ALIASES.items():
    # absl counts an alias' use on the flag it stands for too.
    if flag_values[alias].present and (flag_values[name].present >
                                       flag_values[alias].present):
      found.append(f'--{alias} is another name for --{name}: give one of'
                   ' them')
  values = values_of(flag_values)
  cohort = values['clients_per_round'] or f.DEFAULT_CLIENTS_PER_ROUND
  if values['rounds_to_double_cohort'] and values['max_cohort_size'] < cohort:
    found.append(
        f'--max_cohort_size={values["max_cohort_size"]} is below'
        f' --clients_per_round={cohort}: the doubling cohort would start at'
        f' {values["max_cohort_size"]}, not {cohort}; raise --max_cohort_size'
        ' or lower --clients_per_round')
  return found


def check_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """Refuses flags given on the command line that the run would not use,
  and flags whose values another flag would override.

  Raises:
    ConflictingFlagsError: naming both flags of each conflict, in one line.
    UnusedFlagError: naming each unused flag and why, in one line.
    tuned_defaults.MissingTunedRateError: If an unset learning rate has no
      tuned value for the task and optimizer.
  """
  found = conflicts(flag_values)
  if found:
    raise ConflictingFlagsError('; '.join(found))
  values = values_of(flag_values)
  why = unused_flags(values)
  given = sorted(name for name, flag in driver_flags(flag_values).items()
                 if flag.present and name in why)
  if given:
    raise UnusedFlagError(
        '; '.join(f'--{name} {why[name]}' for name in given)
        + '. Were the flags set by mistake? Remove them.')
  effective_hparams(values)  # Refuses a missing tuned rate before any work.


def effective_hparams(values: Mapping[str, Any]) -> dict[str, Any]:
  """The values the run derives from unset flags (tuned rates, task
  defaults), by flag name."""
  algorithm = values['algorithm']
  task = tasks.TASKS[values['task']]
  honoured = families.FAMILY_OF[algorithm].shared_flags[algorithm]
  effective = {}
  if 'train_batch_size' in honoured:
    effective['train_batch_size'] = (values['train_batch_size'] or
                                     task.train_batch_size)
  if 'client_epochs' in honoured:
    effective['client_epochs'] = values['client_epochs'] or task.client_epochs
  if 'clipping' in honoured and values['clipping'] is None:
    effective['clipping'] = f.clipping_default(algorithm)
  unused = unused_task_flags(values['task'], values)
  for spec in task.flags:
    if spec.default is not None and spec.name not in unused:
      effective[spec.name] = (spec.default if values[spec.name] is None
                              else values[spec.name])
  effective.update(
      families.FAMILY_OF[algorithm].effective_hparams(algorithm, values))
  return effective


def recorded_hparams(values: Mapping[str, Any]) -> dict[str, Any]:
  """What hparams.json holds: the flags in use and the values derived from
  them, without the flags that only say where or how fast it runs."""
  unused = unused_flags(values)
  recorded = {name: value for name, value in values.items()
              if name not in unused and name not in f.NOT_HPARAMS}
  recorded.update(effective_hparams(values))
  return dict(sorted(recorded.items()))


def _require_finite_floats() -> None:
  """Every float flag of the driver must be finite in float32, the dtype
  the computations use (absl's bounds let NaN through: every comparison
  with NaN is false; 1e308 is finite in float64 only)."""
  for name, flag in driver_flags().items():
    if isinstance(flag.parser, flags.FloatParser):
      flags.register_validator(
          name, f.is_finite_or_none,
          message=f'must be a finite number in float32 (|x| <='
                  f' {f.FLOAT32_MAX:.4g})')


_require_finite_floats()
