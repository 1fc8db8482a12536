"""tasks.cifar100: ResNet-18 with 2-group norms, 24x24 crops, offline checks."""

import os

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from fl_common.tff_private import resnet_models

from tasks import cifar100
from tests import task_checks


def _group_norms(model):
  return [
      layer
      for layer in model.layers
      if isinstance(layer, tf.keras.layers.GroupNormalization)
  ]


def test_resnet18_has_tffs_architecture_with_two_groups_per_norm():
  ours = cifar100.create_resnet18_two_group_norm()
  tffs = resnet_models.create_resnet18(input_shape=(24, 24, 3), num_classes=100)
  assert [type(layer) for layer in ours.layers] == [
      type(layer) for layer in tffs.layers
  ]
  assert [w.shape for w in ours.weights] == [w.shape for w in tffs.weights]
  assert _group_norms(ours) and {g.groups for g in _group_norms(ours)} == {2}
  assert {g.groups for g in _group_norms(tffs)} == {32}  # why we clone it


def test_two_groups_normalize_each_half_of_the_channels():
  # A 2-group norm standardizes each half of the channels over (H, W, C/2).
  model = cifar100.create_resnet18_two_group_norm()
  norm = _group_norms(model)[0]
  channels = norm.gamma.shape[0]
  x = np.random.RandomState(0).normal(3.0, 2.0, (1, 4, 4, channels))
  out = norm(x.astype(np.float32)).numpy()  # gamma 1, beta 0 at init
  halves = zip(np.split(x, 2, axis=-1), np.split(out, 2, axis=-1))
  for x_half, out_half in halves:
    expected = (x_half - x_half.mean()) / np.sqrt(x_half.var() + norm.epsilon)
    np.testing.assert_allclose(out_half, expected, rtol=1e-3, atol=1e-3)


def test_task_model_uses_the_two_group_resnet_on_24x24_crops():
  task = cifar100.create_cifar100_task(
      use_synthetic_data=True, validation_fraction=0.0
  )
  images, labels = task.datasets.element_type_structure
  assert images.shape.as_list() == [None, 24, 24, 3]
  assert labels.shape.as_list() == [None]
  with tf.Graph().as_default():
    # pylint: disable-next=protected-access
    keras_model = task.model_fn()._keras_model
    assert {g.groups for g in _group_norms(keras_model)} == {2}
    assert keras_model.output_shape == (None, 100)


def test_fedavg_trains_two_rounds_on_two_clients_one_batch_each():
  task = cifar100.create_cifar100_task(
      train_batch_size=2,
      max_elements_per_client=2,
      use_synthetic_data=True,
      validation_fraction=0.0,
  )
  run = task_checks.train_fedavg(
      task, task.datasets.train_data.client_ids, client_learning_rate=0.01
  )
  for train_metrics in run.train_metrics:
    assert train_metrics['num_examples'] == 2 * 2
    assert cifar100.ACCURACY_METRIC_NAME in train_metrics
    assert np.isfinite(train_metrics['loss'])


def test_validation_split_is_the_seeded_client_split():
  task = cifar100.create_cifar100_task(
      use_synthetic_data=True, validation_fraction=0.2, seed=9
  )
  task_checks.assert_seeded_validation_split(
      task, tff.simulation.datasets.cifar100.get_synthetic().client_ids, 0.2,
      seed=9
  )


def test_missing_data_is_one_line_naming_the_file_and_writes_nothing(
    tmp_path,
):
  message = task_checks.missing_data_message(
      cifar100.create_cifar100_task, tmp_path
  )
  assert str(tmp_path / 'cifar100.sqlite') in message
  assert not os.listdir(tmp_path)
