"""What LARS and LAMB share: the layer-wise trust ratio and optimizer plumbing.

FedLARS and FedLamb (Charles et al. 2021, Section 5.2; SPEC.md §1) use LARS
and LAMB (You et al. 2020, Algorithms 1 and 2) as server optimizers. Both
rescale a per-layer step direction `u` (LARS: the momentum; LAMB: the Adam
direction) by the trust ratio `‖x‖₂ / (‖u‖₂ + ε)` with `φ = identity`, and
both are `tff.learning.optimizers.Optimizer`s whose state is their
hyperparameters followed by their per-variable slots. `lars.py` and `lamb.py`
keep their own update rules and docstrings; this module holds the rest.
"""

import abc
import collections
from collections.abc import Collection
from typing import Any, Union

import tensorflow as tf
import tensorflow_federated as tff
from fl_common.tff_private import structure

Float = Union[float, tf.Tensor]
State = collections.OrderedDict[str, Any]


def trust_ratio(weights: tf.Tensor, direction: tf.Tensor,
                epsilon: Float = 0.0) -> tf.Tensor:
  """`‖weights‖ / (‖direction‖ + ε)`, or 1 when either norm is zero."""
  weights_norm = tf.norm(weights)
  direction_norm = tf.norm(direction)
  both_positive = tf.logical_and(weights_norm > 0.0, direction_norm > 0.0)
  return tf.where(both_positive,
                  tf.math.divide_no_nan(weights_norm, direction_norm + epsilon),
                  tf.ones_like(weights_norm))


def zeros_like_specs(specs: Any) -> Any:
  """Zero tensors with the structure, shapes and dtypes of `specs`."""
  return tf.nest.map_structure(lambda spec: tf.zeros(spec.shape, spec.dtype),
                               specs)


def _check_hparams(optimizer_name: str, hparams: State,
                   decay_names: Collection[str]) -> None:
  """Raises ValueError for a Python hyperparameter out of its range.

  The hyperparameters named in `decay_names` must be in [0, 1), the others
  >= 0; tensors are not checked.
  """
  for name, value in hparams.items():
    if tf.is_tensor(value):
      continue
    if name in decay_names:
      if not 0.0 <= value < 1.0:
        raise ValueError(
            f'{optimizer_name} {name} must be in [0, 1), got {value}.')
    elif value < 0.0:
      raise ValueError(f'{optimizer_name} {name} must be >= 0, got {value}.')


class TrustRatioOptimizer(tff.learning.optimizers.Optimizer, abc.ABC):
  """A TFF optimizer whose state is its hyperparameters, then its slots.

  `get_hparams` and `set_hparams` read and replace the hyperparameters, which
  include `learning_rate` under `tff.learning.optimizers.LEARNING_RATE_KEY`
  so the optimizer composes with
  `tff.learning.optimizers.schedule_learning_rate`. A subclass gives the
  initial slots and the update of slots and weights.
  """

  def __init__(self, optimizer_name: str, hparams: State,
               decay_names: Collection[str]):
    """Checks and keeps the hyperparameters.

    Args:
      optimizer_name: Names the optimizer in error messages.
      hparams: The hyperparameters by name, in their order in the state.
      decay_names: The hyperparameters that must be in [0, 1); the others
        must be >= 0.

    Raises:
      ValueError: If a hyperparameter is out of its range.
    """
    _check_hparams(optimizer_name, hparams, decay_names)
    self._hparams = hparams

  @abc.abstractmethod
  def _initial_slots(self, specs: Any) -> State:
    """The state entries after the hyperparameters, before any step."""

  @abc.abstractmethod
  def _update(self, hparams: State, state: State, weights: Any,
              gradients: Any) -> tuple[State, Any]:
    """One step: `(new slots, new weights)` from the current state."""

  def initialize(self, specs: Any) -> State:
    return collections.OrderedDict(
        [*self._hparams.items(), *self._initial_slots(specs).items()])

  def next(self, state: State, weights: Any,
           gradients: Any) -> tuple[State, Any]:
    gradients = tff.learning.optimizers.handle_indexed_slices_gradients(
        gradients)
    tff.learning.optimizers.check_weights_gradients_match(weights, gradients)
    hparams = self.get_hparams(state)
    slots, updated_weights = self._update(hparams, state, weights, gradients)
    return collections.OrderedDict(
        [*hparams.items(), *slots.items()]), updated_weights

  def get_hparams(self, state: State) -> State:
    return collections.OrderedDict((k, state[k]) for k in self._hparams)

  def set_hparams(self, state: State, hparams: State) -> State:
    return structure.update_struct(state, **hparams)
