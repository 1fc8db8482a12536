"""The optimizer registry: every entry builds, and the driver's flags, flag
rules and `build_optimizer` are derived from it."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff
from absl import flags

from experiment_driver import flag_groups
from fl_common import optimizers

FLAGS = flags.FLAGS


@pytest.mark.parametrize('name', optimizers.OPTIMIZER_NAMES)
def test_each_entry_builds_with_its_defaults_and_takes_a_step(name):
  optimizer = optimizers.build_optimizer(name, 0.1)
  assert isinstance(optimizer, tff.learning.optimizers.Optimizer)
  weights = (tf.constant([1.0, -2.0]),)
  state = optimizer.initialize((tf.TensorSpec([2], tf.float32),))
  _, new_weights = optimizer.next(state, weights, (tf.constant([0.5, 0.5]),))
  assert np.all(np.asarray(new_weights[0]) < np.asarray(weights[0]))


@pytest.mark.parametrize('name', optimizers.OPTIMIZER_NAMES)
def test_an_entry_reads_exactly_its_hyperparameters(name):
  entry = optimizers.OPTIMIZERS[name]
  assert set(entry.hyperparameters) <= set(optimizers.HYPERPARAMETERS_SPECS)
  # Its builder takes exactly them: each is passed, no other is.
  entry.build(0.1, **{h: optimizers.HYPERPARAMETERS_SPECS[h].default
                      for h in entry.hyperparameters})
  others = set(optimizers.HYPERPARAMETERS_SPECS) - set(entry.hyperparameters)
  for other in others:
    with pytest.raises(TypeError):
      entry.build(0.1, **{other: optimizers.HYPERPARAMETERS_SPECS[other]
                          .default})


def test_a_hyperparameter_changes_only_the_optimizers_that_take_it():
  weights = (tf.constant([1.0, -2.0]),)
  # Gradients that change between steps (with a constant one, Adam's
  # bias-corrected moments would not depend on its betas).
  steps = [(tf.constant(g),) for g in ([0.5, -0.25], [-0.1, 0.4], [0.3, 0.2])]

  def three_steps(name, **kw):
    optimizer = optimizers.build_optimizer(name, 0.1, **kw)
    state = optimizer.initialize((tf.TensorSpec([2], tf.float32),))
    w = weights
    for gradients in steps:
      state, w = optimizer.next(state, w, gradients)
    return np.asarray(w[0])

  for name, entry in optimizers.OPTIMIZERS.items():
    for hyperparameter in optimizers.HYPERPARAMETERS_SPECS:
      changed = not np.allclose(three_steps(name),
                                three_steps(name, **{hyperparameter: 0.5}))
      assert changed == (hyperparameter in entry.hyperparameters), (
          name, hyperparameter)


def test_unknown_names_are_refused():
  with pytest.raises(ValueError, match='unknown optimizer'):
    optimizers.build_optimizer('no_such_optimizer', 0.1)
  with pytest.raises(TypeError, match="'nesterov' is not"):
    optimizers.build_optimizer('sgdm', 0.1, nesterov=1.0)


def test_the_driver_has_one_flag_per_role_and_hyperparameter():
  for role in ('client', 'server'):
    assert FLAGS[f'{role}_optimizer'].parser.enum_values == list(
        optimizers.OPTIMIZER_NAMES)
    for name, spec in optimizers.HYPERPARAMETERS_SPECS.items():
      flag = FLAGS[f'{role}_{name}']
      assert flag.default == spec.default
      users = [o for o, e in optimizers.OPTIMIZERS.items()
               if name in e.hyperparameters]
      assert f'({", ".join(users)})' in flag.help
    assert flag_groups.optimizer_flag_names(role) == {
        f'{role}_optimizer', f'{role}_learning_rate',
        *(f'{role}_{h}' for h in optimizers.HYPERPARAMETERS_SPECS)}
