"""The Keras models of AdaBest's experiments (Varno et al. 2022, Section 4).

AdaBest uses the models of FedDyn (Acar et al. 2021) and McMahan et al.
(2017); layer shapes follow FedDyn's code (`utils_models.py`):

* EMNIST-L: an MLP, flatten -> dense 100 -> dense 100 -> classes (ReLU).
* CIFAR-10/100: conv 5x5x64 (valid) -> max-pool 2x2/2 -> conv 5x5x64 ->
  max-pool 2x2/2 -> flatten (5*5*64) -> dense 394 -> dense 192 -> classes
  (ReLU). The paper and its SPEC say 394 units; FedDyn's code has 384, most
  likely the number the paper meant. 394 is the default here and
  `dense_units` takes either.
* Synthetic (this package's offline stand-in): multinomial logistic
  regression.

All models output logits. Weight decay: AdaBest trains with PyTorch's
`SGD(weight_decay=wd)`, which adds `wd * w` to the gradient of every
parameter, biases included. Here every kernel and bias gets an L2
regularizer of `wd / 2`, whose gradient is that same `wd * w`; TFF's
`from_keras_model` adds `model.losses` to the training loss
(`keras_utils._KerasModel._forward_pass`).
"""

from collections.abc import Sequence
from typing import Optional

import tensorflow as tf


def _regularizer(weight_decay: float) -> tf.keras.regularizers.Regularizer:
  """L2 penalty `wd / 2 * ||w||^2`, whose gradient is SGD weight decay."""
  if not weight_decay >= 0:
    raise ValueError(f'weight_decay must be non-negative, got {weight_decay}.')
  return tf.keras.regularizers.L2(weight_decay / 2)


def _dense(
    units: int, weight_decay: float, activation: Optional[str] = None
) -> tf.keras.layers.Dense:
  return tf.keras.layers.Dense(
      units,
      activation=activation,
      kernel_regularizer=_regularizer(weight_decay),
      bias_regularizer=_regularizer(weight_decay),
  )


def create_mlp(
    *,
    input_shape: Sequence[int] = (28, 28, 1),
    num_classes: int = 26,
    hidden_units: Sequence[int] = (100, 100),
    weight_decay: float = 1e-4,
) -> tf.keras.Model:
  """AdaBest's EMNIST-L MLP: two ReLU layers of 100 units, then logits.

  Args:
    input_shape: Shape of one input; it is flattened.
    num_classes: Number of output logits.
    hidden_units: Width of each hidden layer.
    weight_decay: SGD weight decay, applied as L2 of `weight_decay / 2` on
      every kernel and bias.

  Returns:
    An uncompiled `tf.keras.Model`.
  """
  layers = [
      tf.keras.layers.InputLayer(input_shape=tuple(input_shape)),
      tf.keras.layers.Flatten(),
  ]
  layers += [_dense(units, weight_decay, 'relu') for units in hidden_units]
  layers.append(_dense(num_classes, weight_decay))
  return tf.keras.Sequential(layers, name='adabest_mlp')


def create_cnn(
    *,
    input_shape: Sequence[int] = (32, 32, 3),
    num_classes: int = 10,
    dense_units: Sequence[int] = (394, 192),
    weight_decay: float = 1e-3,
) -> tf.keras.Model:
  """AdaBest's CIFAR CNN: two 5x5x64 conv + max-pool blocks, two dense layers.

  Args:
    input_shape: Shape of one image.
    num_classes: Number of output logits (10 or 100).
    dense_units: Width of the two ReLU dense layers (paper: 394, 192;
      FedDyn's code: 384, 192).
    weight_decay: SGD weight decay, applied as L2 of `weight_decay / 2` on
      every kernel and bias.

  Returns:
    An uncompiled `tf.keras.Model`.
  """
  layers = [tf.keras.layers.InputLayer(input_shape=tuple(input_shape))]
  for _ in range(2):
    layers += [
        tf.keras.layers.Conv2D(
            64,
            5,
            activation='relu',
            kernel_regularizer=_regularizer(weight_decay),
            bias_regularizer=_regularizer(weight_decay),
        ),
        tf.keras.layers.MaxPool2D(pool_size=2, strides=2),
    ]
  layers.append(tf.keras.layers.Flatten())
  layers += [_dense(units, weight_decay, 'relu') for units in dense_units]
  layers.append(_dense(num_classes, weight_decay))
  return tf.keras.Sequential(layers, name='adabest_cnn')


def create_small_cnn(
    *,
    input_shape: Sequence[int] = (8, 8, 1),
    num_classes: int = 10,
    weight_decay: float = 1e-4,
) -> tf.keras.Model:
  """A small CNN for 8x8 images (scikit-learn's digits): two 3x3 'same' conv
  + max-pool blocks (32, 64 filters), a 128-unit ReLU dense layer, logits.

  AdaBest's CIFAR CNN does not fit 8x8 inputs (its 5x5 'valid' convolutions
  leave nothing after the first pooling); this keeps its shape, scaled down.

  Args:
    input_shape: Shape of one image.
    num_classes: Number of output logits.
    weight_decay: SGD weight decay, applied as L2 of `weight_decay / 2` on
      every kernel and bias.

  Returns:
    An uncompiled `tf.keras.Model`.
  """
  layers = [tf.keras.layers.InputLayer(input_shape=tuple(input_shape))]
  for filters in (32, 64):
    layers += [
        tf.keras.layers.Conv2D(
            filters, 3, padding='same', activation='relu',
            kernel_regularizer=_regularizer(weight_decay),
            bias_regularizer=_regularizer(weight_decay)),
        tf.keras.layers.MaxPool2D(pool_size=2, strides=2),
    ]
  layers += [tf.keras.layers.Flatten(), _dense(128, weight_decay, 'relu'),
             _dense(num_classes, weight_decay)]
  return tf.keras.Sequential(layers, name='small_cnn')


def create_logistic_regression(
    *,
    input_shape: Sequence[int] = (60,),
    num_classes: int = 10,
    weight_decay: float = 1e-5,
) -> tf.keras.Model:
  """Multinomial logistic regression (one dense layer of logits).

  Args:
    input_shape: Shape of one input, `(num_features,)`.
    num_classes: Number of output logits.
    weight_decay: SGD weight decay, applied as L2 of `weight_decay / 2` on
      the kernel and bias (FedDyn's synthetic experiments use 1e-5).

  Returns:
    An uncompiled `tf.keras.Model`.
  """
  return tf.keras.Sequential(
      [
          tf.keras.layers.InputLayer(input_shape=tuple(input_shape)),
          _dense(num_classes, weight_decay),
      ],
      name='logistic_regression',
  )
