"""FedOpt and FedSGD match a NumPy reference on a tiny linear model."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fl_common import diagnostics
from large_cohort import fedopt
from fl_common import optimizers

_NUM_FEATURES = 3
_CLIENT_LR = 0.05
_SERVER_LR = 0.3
_EPS = 1e-3
_BATCH = 2


def _client_arrays():
  rng = np.random.default_rng(7)
  sizes = (4, 3)  # unequal: example weighting matters, second has a short batch
  return [(rng.normal(size=(n, _NUM_FEATURES)).astype(np.float32),
           rng.normal(size=(n, 1)).astype(np.float32)) for n in sizes]


def _datasets(arrays, batch_size=_BATCH):
  return [tf.data.Dataset.from_tensor_slices(
      collections.OrderedDict(x=x, y=y)).batch(batch_size) for x, y in arrays]


def _model_fn():
  keras_model = tf.keras.Sequential([
      tf.keras.layers.InputLayer(input_shape=(_NUM_FEATURES,)),
      tf.keras.layers.Dense(1, kernel_initializer='zeros',
                            bias_initializer='zeros'),
  ])
  return tff.learning.models.from_keras_model(
      keras_model,
      loss=tf.keras.losses.MeanSquaredError(),
      input_spec=_datasets(_client_arrays())[0].element_spec,
  )


def _gradient(w, b, x, y):
  """Gradient of the batch-mean squared error of the model x @ w + b."""
  residual = x @ w + b - y
  return 2 * x.T @ residual / len(x), 2 * residual.sum(axis=0) / len(x)


def _client_delta(w, b, x, y, learning_rate):
  w_k, b_k = w.copy(), b.copy()
  for start in range(0, len(x), _BATCH):
    gw, gb = _gradient(w_k, b_k, x[start:start + _BATCH], y[start:start + _BATCH])
    w_k, b_k = w_k - learning_rate * gw, b_k - learning_rate * gb
  return w_k - w, b_k - b


class _NumpyServerOptimizer:
  """The published updates, in TFF's conventions (eps placement, bias fix)."""

  def __init__(self, name):
    self.name, self.step, self.m, self.v = name, 0, None, None

  def apply(self, params, grads):
    if self.m is None:
      self.m = [np.zeros_like(p) for p in params]
      self.v = [np.zeros_like(p) for p in params]
    self.step += 1
    t = self.step
    out = []
    for i, (p, g) in enumerate(zip(params, grads)):
      if self.name == 'sgd':
        out.append(p - _SERVER_LR * g)
      elif self.name == 'sgdm':
        self.m[i] = 0.9 * self.m[i] + g
        out.append(p - _SERVER_LR * self.m[i])
      elif self.name == 'adagrad':
        self.v[i] = self.v[i] + g**2
        out.append(p - _SERVER_LR * g / np.sqrt(self.v[i] + _EPS))
      elif self.name in ('adam', 'yogi'):
        self.m[i] = 0.9 * self.m[i] + 0.1 * g
        if self.name == 'adam':
          self.v[i] = 0.99 * self.v[i] + 0.01 * g**2
        else:
          self.v[i] = self.v[i] + 0.01 * np.sign(g**2 - self.v[i]) * g**2
        lr_t = _SERVER_LR * np.sqrt(1 - 0.99**t) / (1 - 0.9**t)
        out.append(p - lr_t * self.m[i] / (np.sqrt(self.v[i]) + _EPS))
    return out


def _weights(process, state):
  weights = process.get_model_weights(state).trainable
  return [np.asarray(v) for v in weights]


@pytest.mark.parametrize('server_optimizer',
                         ['sgd', 'sgdm', 'adagrad', 'adam', 'yogi'])
def test_fedopt_two_rounds_match_numpy(server_optimizer):
  process = fedopt.build_fedopt(
      _model_fn,
      client_optimizer=optimizers.build_optimizer('sgd', _CLIENT_LR),
      server_optimizer=optimizers.build_optimizer(
          server_optimizer, _SERVER_LR, epsilon=_EPS))
  arrays = _client_arrays()
  state = process.initialize()
  reference = _NumpyServerOptimizer(server_optimizer)
  w = np.zeros((_NUM_FEATURES, 1), np.float32)
  b = np.zeros((1,), np.float32)
  for _ in range(2):
    state = process.next(state, _datasets(arrays)).state
    deltas = [_client_delta(w, b, x, y, _CLIENT_LR) for x, y in arrays]
    weights = np.array([len(x) for x, _ in arrays], np.float64)
    mean_delta = [sum(wt * d[i] for wt, d in zip(weights, deltas)) /
                  weights.sum() for i in range(2)]
    w, b = reference.apply([w, b], [-d for d in mean_delta])
    got_w, got_b = _weights(process, state)
    np.testing.assert_allclose(got_w, w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_b, b, rtol=1e-5, atol=1e-6)


def test_uniform_weighting_averages_clients_equally():
  process = fedopt.build_fedopt(
      _model_fn,
      client_optimizer=optimizers.build_optimizer('sgd', _CLIENT_LR),
      server_optimizer=optimizers.build_optimizer('sgd', 1.0),
      client_weighting=tff.learning.ClientWeighting.UNIFORM)
  arrays = _client_arrays()
  state = process.next(process.initialize(), _datasets(arrays)).state
  zeros_w, zeros_b = np.zeros((_NUM_FEATURES, 1)), np.zeros((1,))
  deltas = [_client_delta(zeros_w, zeros_b, x, y, _CLIENT_LR) for x, y in arrays]
  np.testing.assert_allclose(_weights(process, state)[0],
                             (deltas[0][0] + deltas[1][0]) / 2, rtol=1e-5)


def test_diverged_client_is_discarded_and_reported():
  # A NaN feature makes one client's delta non-finite. TFF's client work
  # zeroes it with weight 0, so the round equals the round without it, and
  # the diagnostics aggregator reports it as a zero update.
  def build():
    return fedopt.build_fedopt(
        _model_fn,
        client_optimizer=optimizers.build_optimizer('sgd', _CLIENT_LR),
        server_optimizer=optimizers.build_optimizer('sgd', _SERVER_LR),
        model_aggregator=diagnostics.diagnostics_factory(
            tff.aggregators.MeanFactory()))
  arrays = _client_arrays()
  diverged_x = arrays[1][0].copy()
  diverged_x[0, 0] = np.nan
  process = build()
  output = process.next(process.initialize(),
                        _datasets([arrays[0], (diverged_x, arrays[1][1])]))
  clean = build()
  reference = clean.next(clean.initialize(), _datasets(arrays[:1])).state
  for got, want in zip(_weights(process, output.state),
                       _weights(clean, reference)):
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, want, rtol=1e-6)
  aggregator = output.metrics['aggregator']
  assert aggregator['num_zero_updates'] == 1
  assert aggregator['num_nonfinite_updates'] == 0
  assert aggregator['num_clients'] == 2


def test_fedsgd_takes_one_full_batch_gradient_step():
  process = fedopt.build_fedsgd(
      _model_fn, server_optimizer=optimizers.build_optimizer('sgd', _SERVER_LR))
  arrays = _client_arrays()
  state = process.next(process.initialize(), _datasets(arrays)).state
  zeros_w, zeros_b = np.zeros((_NUM_FEATURES, 1)), np.zeros((1,))
  x = np.concatenate([a[0] for a in arrays])
  y = np.concatenate([a[1] for a in arrays])
  gw, gb = _gradient(zeros_w, zeros_b, x, y)  # full-batch over all examples
  got_w, got_b = _weights(process, state)
  np.testing.assert_allclose(got_w, -_SERVER_LR * gw, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(got_b, -_SERVER_LR * gb, rtol=1e-5, atol=1e-6)


def test_unknown_optimizer_is_rejected():
  with pytest.raises(ValueError, match='unknown optimizer'):
    optimizers.build_optimizer('rmsprop', 0.1)


def _run_client_work(work, rounds, data, hparams=None):
  """Each round's result and measurements of `work` (weights fixed at a
  point off zero, so that every client's loss has a gradient)."""
  weights_type = tff.learning.models.weights_type_from_model(_model_fn)
  weights = tff.learning.models.ModelWeights(
      trainable=[np.full(t.shape, 0.3, np.float32)
                 for t in weights_type.trainable],
      non_trainable=[])
  state = work.initialize()
  if hparams is not None:
    state = work.set_hparams(state, hparams)
  outputs = []
  for _ in range(rounds):
    output = work.next(state, [weights] * len(data), data)
    state = output.state
    outputs.append(output)
  return state, outputs


@pytest.mark.parametrize('weighting', [tff.learning.ClientWeighting.NUM_EXAMPLES,
                                       tff.learning.ClientWeighting.UNIFORM])
def test_the_client_stated_once_behaves_as_tffs_model_delta_client_work(
    weighting):
  # FedOpt's client is stated once (`fedopt.client_program`) and run per
  # client by `fl_engine.client_program`; it must be TFF's client work:
  # the same hparams state, updates, weights and metrics, including a
  # non-finite client (zero update, weight 0, its metrics dropped).
  arrays = _client_arrays()
  diverged_x = arrays[1][0].copy()
  diverged_x[0, 0] = np.nan
  data = _datasets([arrays[0], (diverged_x, arrays[1][1]), arrays[1]])
  client_optimizer = optimizers.build_optimizer('sgdm', _CLIENT_LR)
  ours = fedopt.build_client_work(_model_fn, client_optimizer=client_optimizer,
                                  client_weighting=weighting)
  tffs = tff.learning.templates.build_model_delta_client_work(
      _model_fn, client_optimizer, weighting)
  assert ours.initialize.type_signature == tffs.initialize.type_signature
  assert ours.next.type_signature == tffs.next.type_signature
  hparams = tffs.get_hparams(tffs.initialize())
  hparams['learning_rate'] = 0.02  # set_hparams reaches the clients
  got_state, got = _run_client_work(ours, 2, data, hparams)
  want_state, want = _run_client_work(tffs, 2, data, hparams)
  tf.nest.map_structure(np.testing.assert_allclose, got_state, want_state)
  for g, w in zip(got, want):
    tf.nest.map_structure(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7),
        (g.result, g.measurements), (w.result, w.measurements))
  weights = [r.update_weight for r in got[0].result]
  assert weights[1] == 0 and weights[0] > 0 and weights[2] > 0
  assert np.all(np.asarray(got[0].result[1].update[0]) == 0)


def test_fedsgd_stated_once_behaves_as_tffs_fed_sgd():
  # FedSGD's client is stated once (`fedopt.fedsgd_client_program`); run per
  # client it must be TFF's FedSGD: the same state and metrics each round,
  # with a client whose gradient is non-finite (weight 0, metrics kept).
  arrays = _client_arrays()
  diverged_x = arrays[1][0].copy()
  diverged_x[0, 0] = np.nan
  data = _datasets([arrays[0], (diverged_x, arrays[1][1]), arrays[1]])
  server_optimizer = optimizers.build_optimizer('adam', _SERVER_LR)
  ours = fedopt.build_fedsgd(_model_fn, server_optimizer=server_optimizer)
  tffs = tff.learning.algorithms.build_fed_sgd(
      _model_fn, server_optimizer_fn=server_optimizer)
  assert ours.next.type_signature == tffs.next.type_signature
  got, want = ours.initialize(), tffs.initialize()
  for _ in range(2):
    got_output, want_output = ours.next(got, data), tffs.next(want, data)
    got, want = got_output.state, want_output.state
    tf.nest.map_structure(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7),
        (got, got_output.metrics), (want, want_output.metrics))
  assert got_output.metrics['client_work']['train']['num_examples'] == 10
  assert np.all(np.isfinite(_weights(ours, got)[0]))
