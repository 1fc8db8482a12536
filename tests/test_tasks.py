"""tasks (the registry): names, defaults, dispatch, and a uniform signature."""

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


def test_default_batch_sizes_are_the_papers():
  # SPEC.md §1 (large-cohort Table 2), §2 (AdaBest: 45), §3 (GeL: 5 for
  # Synthetic).
  assert {name: record.train_batch_size
          for name, record in tasks.TASKS.items()} == {
      'cifar100': 20,
      'emnist': 20,
      'shakespeare': 4,
      'stackoverflow': 32,
      'synthetic': 5,
      'emnist_l': 45,
      'cifar10': 45,
      'cifar100_partitioned': 45,
      'synthetic_partitioned': 45,
      'digits': 45,
  }
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
            'partition_seed'} <= set(parameters)


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
