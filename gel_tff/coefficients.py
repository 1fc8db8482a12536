"""GeL's Figure 3: a client update's gradient coefficients, measured.

Local SGD(M), with or without GeL's guessed steps, moves a client's model by
a linear combination of the gradients it computed (Boukhari et al. 2024,
Section 3.2; Lemma 1, eq. (6)). `measure_gradient_coefficients` reads that
combination off the client update the GeL processes run, so that the figure
shows the implementation, not a transcription of the formula.
"""

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from gel_tff import client_work


class _ProbeLoss(tf.keras.losses.Loss):
  """`sum(y_pred)`: its gradient in a linear model's weights is the input."""

  def __init__(self):
    super().__init__(reduction='sum', name='probe_loss')

  def call(self, y_true, y_pred):
    del y_true
    return y_pred


def measure_gradient_coefficients(
    *,
    momentum: float,
    gradient_steps: int,
    guessed_steps: client_work.GuessedSteps = 0,
    learning_rate: float = 0.1,
) -> np.ndarray:
  """A client's gradient coefficients `a_i`, measured by running its update.

  Local SGD(M) with guesses moves the model by a linear combination of the
  gradients it computed, `x^(t,0) - x^(t,tau_i+tau') = eta_l G_i a_i`
  (Section 3.2, Lemma 1). This runs the client update that the GeL
  processes run (`client_work.build_client_update_fn`) on a probe whose
  gradient at step `k` is the unit vector `e_k`: a linear model `w` in
  R^`gradient_steps` with loss `w . x`, fed the batches `x = e_0, e_1, ...`.
  The update's `k`-th coordinate divided by `eta_l` is then `a_i[k]`,
  whatever the implementation does in between; eq. (6) is the paper's
  closed form to compare it with (Figure 3; `client_work.lemma1_norm` is
  its sum, FedNova's normalizer).

  Args:
    momentum: The client momentum `alpha` in [0, 1).
    gradient_steps: `tau_i`, the gradient steps (batches) the client takes.
    guessed_steps: `tau'` as a count, or `'infinite'`.
    learning_rate: `eta_l` (> 0); `a_i` does not depend on it.

  Returns:
    `a_i`, one float64 coefficient per gradient step.
  """
  if guessed_steps == client_work.REMAINING:
    raise ValueError("guessed_steps must be a count or 'infinite' here.")
  client_work.validate_client_work_args(
      learning_rate=learning_rate, momentum=momentum,
      expected_steps=gradient_steps, guessed_steps=guessed_steps,
      proximal_strength=0.0,
      client_weighting=tff.learning.ClientWeighting.UNIFORM)
  size = gradient_steps

  def model_fn():
    keras_model = tf.keras.Sequential([
        tf.keras.Input(shape=(size,)),
        tf.keras.layers.Dense(1, use_bias=False, kernel_initializer='zeros'),
    ])
    return tff.learning.models.from_keras_model(
        keras_model,
        loss=_ProbeLoss(),
        input_spec=(tf.TensorSpec([None, size], tf.float32),
                    tf.TensorSpec([None, 1], tf.float32)))

  optimizer = client_work.client_optimizer(learning_rate, momentum)
  client_update = client_work.build_client_update_fn(
      model_fn, optimizer, expected_steps=gradient_steps,
      guessed_steps=guessed_steps, proximal_strength=0.0,
      client_weighting=tff.learning.ClientWeighting.UNIFORM,
      report_normalizer=False)
  probe = tf.data.Dataset.from_tensor_slices(
      (np.eye(size, dtype=np.float32), np.zeros((size, 1), np.float32)))
  initial = tff.learning.models.ModelWeights(
      trainable=[tf.zeros((size, 1))], non_trainable=[])
  hparams = optimizer.get_hparams(
      optimizer.initialize(tf.TensorSpec([], tf.float32)))
  result, _, steps_taken = client_update(hparams, initial, probe.batch(1))
  if int(steps_taken) != gradient_steps:
    raise AssertionError(f'the probe took {int(steps_taken)} steps, not'
                         f' {gradient_steps}')
  (delta,) = result.update
  return np.asarray(delta, np.float64).reshape(-1) / learning_rate
