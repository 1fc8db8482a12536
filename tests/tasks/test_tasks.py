"""tasks (the registry): names, defaults, dispatch, and a uniform signature."""

import dataclasses
import inspect

import pytest

import tasks

_COMMON_ARGUMENTS = (
    'train_batch_size',
    'eval_batch_size',
    'num_epochs',
    'max_elements_per_client',
    'data_dir',
    'use_synthetic_data',
    'validation_fraction',
    'seed',
)


# SPEC.md §1 (large-cohort Table 2), §2 (AdaBest: 45), §3 (GeL: 5 for
# Synthetic, 20 for Shakespeare), by the tasks the papers run. A task added
# later has its own batch size and is not listed here.
_PAPERS_BATCH_SIZES = {
    'cifar100': 20,
    'emnist': 20,
    'shakespeare': 4,
    'leaf_shakespeare': 20,
    'stackoverflow': 32,
    'synthetic': 5,
    'emnist_l': 45,
    'cifar10': 45,
    'cifar100_partitioned': 45,
    'synthetic_partitioned': 45,
    'digits': 45,
}


def test_default_batch_sizes_are_the_papers():
  assert set(_PAPERS_BATCH_SIZES) <= set(tasks.TASKS)
  assert {name: tasks.TASKS[name].train_batch_size
          for name in _PAPERS_BATCH_SIZES} == _PAPERS_BATCH_SIZES
  assert tasks.TASKS['emnist'].client_epochs == 1
  assert tasks.TASKS['cifar10'].client_epochs == 5


@pytest.mark.parametrize('name', tasks.TASK_NAMES)
def test_every_builder_takes_the_common_arguments_with_its_batch_size(name):
  record = tasks.TASKS[name]
  parameters = inspect.signature(record.builder).parameters
  assert set(_COMMON_ARGUMENTS) <= set(parameters)
  assert parameters['train_batch_size'].default == record.train_batch_size
  if record.partitioned:
    assert {'num_clients', 'dirichlet_alpha', 'unbalanced_sigma',
            'partition_seed'} <= {flag.name for flag in record.flags}
  for flag in record.flags:  # Each own flag names one of its arguments.
    assert flag.argument in parameters, (name, flag.name)
    if flag.default is not None and flag.type is not str:
      assert isinstance(flag.default, flag.type), flag.name
    if flag.needs:
      assert flag.needs[0] in {other.name for other in record.flags}


def test_a_flag_two_tasks_declare_differently_is_refused():
  spec = tasks.TaskFlag('size', 'size', int, 'A size.', example='2')
  record = tasks.TASKS['synthetic']
  same = {'a': record, 'b': dataclasses.replace(record, flags=(spec,)),
          'c': dataclasses.replace(record, flags=(spec,))}
  assert set(tasks.records.flags_by_name(same)) == (
      {flag.name for flag in record.flags} | {'size'})
  other = dataclasses.replace(spec, help='Another size.')
  with pytest.raises(ValueError, match="task 'c' declares --size"):
    tasks.records.flags_by_name(
        {**same, 'c': dataclasses.replace(record, flags=(other,))})


def test_builder_arguments_pass_set_flags_and_defaults_only():
  record = tasks.TASKS['synthetic']
  values = {flag.name: None for flag in record.flags}
  arguments = tasks.records.builder_arguments(
      record, {**values, 'synthetic_alpha': 0.7},
      unused={'synthetic_misaligned_scale'})
  # Set: its value; unset with a default: the default; unset without one
  # (the misaligned fraction) or unused: the builder's own default.
  assert arguments == {'num_classes': 5, 'alpha': 0.7, 'beta': 1.0,
                       'num_clients': 1000}


def test_create_task_dispatches_by_name_with_keyword_arguments():
  task = tasks.create_task(
      'synthetic', num_clients=12, validation_fraction=0.25, seed=1
  )
  assert len(task.datasets.train_data.client_ids) == 9
  assert len(task.datasets.validation_data.client_ids) == 3


def test_unknown_name_is_a_value_error_listing_valid_names():
  with pytest.raises(ValueError) as raised:
    tasks.create_task('mnist')
  message = str(raised.value)
  assert "'mnist'" in message
  for name in tasks.TASK_NAMES:
    assert name in message


def test_missing_data_error_is_exported():
  assert issubclass(tasks.MissingDataError, Exception)
  assert tasks.MissingDataError is tasks.errors.MissingDataError
