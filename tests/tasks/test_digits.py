"""tasks.digits: scikit-learn's bundled images under AdaBest's protocol."""

import numpy as np
import pytest

import tasks
from tasks import digits
from tasks import partitioned_task
from tests import run_directories


def test_splits_are_the_bundled_images_stratified_and_fixed():
  train, test, num_classes = digits.load_splits()
  assert num_classes == 10
  assert len(train.x) + len(test.x) == 1797
  assert train.x.shape[1:] == (8, 8, 1) and train.x.dtype == np.float32
  assert 0.0 <= train.x.min() and train.x.max() <= 16.0
  assert len(test.x) == pytest.approx(0.2 * 1797, abs=10)
  # Every class is in the test split in its proportion.
  assert np.all(np.bincount(test.y, minlength=10) >= 30)
  again, _, _ = digits.load_splits()
  np.testing.assert_array_equal(again.y, train.y)


def test_partitioned_like_adabest_with_validation_clients():
  task = tasks.create_task('digits', num_clients=20, dirichlet_alpha=0.3,
                           partition_seed=1)
  train_ids = task.datasets.train_data.client_ids
  assert len(train_ids) == 20
  assert len(task.datasets.validation_data.client_ids) == 2
  sizes = [len(list(task.datasets.train_data.create_tf_dataset_for_client(i)))
           for i in train_ids]
  assert sum(sizes) <= 1437 and max(sizes) > min(sizes)
  batch = next(iter(task.datasets.train_preprocess_fn(
      task.datasets.train_data.create_tf_dataset_for_client(train_ids[0]))))
  assert batch['x'].shape[1:] == (8, 8, 1)
  # Standardized with the training split's moments.
  assert abs(float(np.mean(batch['x']))) < 2.0
  assert not tasks.TASKS['digits'].reads_files


@pytest.mark.parametrize('algorithm_flags', [
    ['--algorithm=fedopt'],
    ['--algorithm=scaffold'],
    ['--algorithm=fednova_gel', '--budget_min=2', '--budget_max=6'],
])
def test_every_family_trains_on_digits_offline(tmp_path, algorithm_flags):
  run_directories.run_driver(
      '--task=digits', '--num_clients=20', '--clients_per_round=5',
      '--total_rounds=2', '--rounds_per_eval=2', *algorithm_flags,
      f'--root_output_dir={tmp_path}', '--experiment_name=d')
  metrics = run_directories.read_metrics(str(tmp_path / 'd'))
  assert list(metrics['round']) == [1, 2]
  assert 0.0 < metrics['test/accuracy'].iloc[-1] <= 1.0


def test_the_cnn_option_builds_a_convolutional_model():
  mlp = tasks.create_task('digits', num_clients=10).model_fn()
  cnn = tasks.create_task('digits', num_clients=10, model='cnn').model_fn()
  kernel_shapes = [tuple(v.shape) for v in cnn.trainable_variables
                   if len(v.shape) == 4]
  assert kernel_shapes == [(3, 3, 1, 32), (3, 3, 32, 64)]
  assert not any(len(v.shape) == 4 for v in mlp.trainable_variables)
  with pytest.raises(ValueError, match="'cnn'"):
    tasks.create_task('emnist_l', num_clients=10, use_synthetic_data=True,
                      model='cnn')


def test_the_wide_mlp_option_is_the_mlp_at_the_wide_units():
  wide = tasks.create_task('digits', num_clients=10,
                           model='wide_mlp').model_fn()
  kernels = [tuple(v.shape) for v in wide.trainable_variables
             if len(v.shape) == 2]
  units = partitioned_task.WIDE_MLP_UNITS
  assert kernels == [(64, units[0]), (units[0], units[1]), (units[1], 10)]


def test_the_driver_trains_the_cnn_and_records_it(tmp_path):
  run_directories.run_driver(
      '--task=digits', '--digits_model=cnn', '--num_clients=10',
      '--clients_per_round=3', '--total_rounds=1', '--rounds_per_eval=1',
      f'--root_output_dir={tmp_path}', '--experiment_name=c')
  with open(tmp_path / 'c' / 'hparams.json') as f:
    assert '"digits_model": "cnn"' in f.read()
  metrics = run_directories.read_metrics(str(tmp_path / 'c'))
  assert 0.0 < metrics['test/accuracy'].iloc[-1] <= 1.0
