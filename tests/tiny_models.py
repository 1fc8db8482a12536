"""Tiny linear models, their client data and NumPy references, for the tests.

Not a test module: test modules import it (`from tests import tiny_models`).
What is here is shared by several test modules; each keeps its own seeds,
sizes and hyperparameters.
"""

import collections
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from fl_engine import stateful_process

ModelFn = Callable[[], tff.learning.models.VariableModel]


def linear_model_fn(num_features: int) -> ModelFn:
  """A model_fn: `Dense(1)` on `num_features` inputs, mean squared error.

  Its input spec is `OrderedDict(x=float32 [None, num_features], y=float32
  [None, 1])`. Its kernel is Glorot-initialized with a fixed seed, so that a
  test's rounds, and any failure of its float comparisons, are the same on
  every run.
  """

  def model_fn() -> tff.learning.models.VariableModel:
    keras_model = tf.keras.Sequential(
        [tf.keras.layers.Dense(
            1, input_shape=(num_features,),
            kernel_initializer=tf.keras.initializers.GlorotUniform(seed=0))])
    return tff.learning.models.from_keras_model(
        keras_model,
        loss=tf.keras.losses.MeanSquaredError(),
        input_spec=collections.OrderedDict(
            x=tf.TensorSpec([None, num_features], tf.float32),
            y=tf.TensorSpec([None, 1], tf.float32)))

  return model_fn


def flat(values: Iterable[Any]) -> np.ndarray:
  """The tensors of `values` raveled and concatenated, in order."""
  return np.concatenate([np.ravel(t) for t in values])


# --- Two clients, one full-batch FedAvg step each (server optimizer tests) ---

FEDAVG_CLIENT_DATA = [
    (np.array([[1.0, 2.0], [0.5, -1.0], [2.0, 0.0]], np.float32),
     np.array([[1.0], [0.0], [2.0]], np.float32)),
    (np.array([[-1.0, 1.0], [0.0, 3.0]], np.float32),
     np.array([[-1.0], [1.5]], np.float32)),
]
FEDAVG_NUM_FEATURES = 2
FEDAVG_CLIENT_LEARNING_RATE = 0.1


def _fedavg_client_datasets() -> list[tf.data.Dataset]:
  """`FEDAVG_CLIENT_DATA` as one full batch per client."""
  return [
      tf.data.Dataset.from_tensor_slices(
          collections.OrderedDict(x=x, y=y)).batch(len(x))
      for x, y in FEDAVG_CLIENT_DATA]


def build_fedavg(
    server_optimizer: tff.learning.optimizers.Optimizer
) -> tff.learning.templates.LearningProcess:
  """TFF's weighted FedAvg of `linear_model_fn` for the two FedAvg clients.

  Clients run SGD at `FEDAVG_CLIENT_LEARNING_RATE`; the server runs
  `server_optimizer`.
  """
  return tff.learning.algorithms.build_weighted_fed_avg(
      linear_model_fn(FEDAVG_NUM_FEATURES),
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(
          FEDAVG_CLIENT_LEARNING_RATE),
      server_optimizer_fn=server_optimizer)


def run_fedavg_rounds(
    process: tff.learning.templates.LearningProcess, num_rounds: int
) -> tuple[list[np.ndarray], list[list[np.ndarray]]]:
  """Runs `process` on `FEDAVG_CLIENT_DATA` (full batches) for `num_rounds`.

  Returns:
    The initial trainable weights (as float64) and the trainable weights
    after each round.
  """
  datasets = _fedavg_client_datasets()
  state = process.initialize()
  initial_weights = [np.asarray(w, np.float64)
                     for w in process.get_model_weights(state).trainable]
  weights_per_round = []
  for _ in range(num_rounds):
    state = process.next(state, datasets).state
    weights_per_round.append(process.get_model_weights(state).trainable)
  return initial_weights, weights_per_round


def numpy_fedavg_update(kernel: np.ndarray,
                        bias: np.ndarray) -> list[np.ndarray]:
  """Example-weighted mean of `x − x_k` after one full-batch SGD step.

  Each client of `FEDAVG_CLIENT_DATA` takes one SGD step at
  `FEDAVG_CLIENT_LEARNING_RATE` on the mean squared error of
  `x @ kernel + bias` from `(kernel, bias)`.
  """
  updates, weights = [], []
  for x, y in FEDAVG_CLIENT_DATA:
    residual = x @ kernel + bias - y
    kernel_gradient = 2.0 * x.T @ residual / len(x)
    bias_gradient = 2.0 * residual.sum(axis=0) / len(x)
    updates.append([FEDAVG_CLIENT_LEARNING_RATE * kernel_gradient,
                    FEDAVG_CLIENT_LEARNING_RATE * bias_gradient])
    weights.append(len(x))
  total = sum(weights)
  return [sum(w * u[i] for w, u in zip(weights, updates)) / total
          for i in range(2)]


# --- A kernel and a zero bias, and seeded gradients (optimizer tests) ---


def optimizer_initial_weights() -> list[np.ndarray]:
  """A 3x2 random kernel and a zero bias (a zero-norm layer)."""
  rng = np.random.default_rng(0)
  kernel = rng.normal(size=(3, 2)).astype(np.float32)
  bias = np.zeros(2, np.float32)
  return [kernel, bias]


def optimizer_gradients(step: int) -> list[np.ndarray]:
  """Seeded gradients of `optimizer_initial_weights`'s shapes for `step`."""
  rng = np.random.default_rng(100 + step)
  kernel_gradient = rng.normal(size=(3, 2)).astype(np.float32)
  bias_gradient = rng.normal(size=2).astype(np.float32)
  return [kernel_gradient, bias_gradient]


def run_optimizer(optimizer: tff.learning.optimizers.Optimizer,
                  num_steps: int) -> list[np.ndarray]:
  """The weights after `num_steps` steps from `optimizer_initial_weights`."""
  weights = [tf.constant(w) for w in optimizer_initial_weights()]
  state = optimizer.initialize(
      [tf.TensorSpec(w.shape, tf.float32) for w in weights])
  for step in range(num_steps):
    state, weights = optimizer.next(
        state, weights, [tf.constant(g) for g in optimizer_gradients(step)])
  return [w.numpy() for w in weights]


# --- Linear regression clients for the stateful (AdaBest family) tests ---


class LinearRegressionProblem:
  """Clients with random regression data, and a `Dense(1)` model of them.

  The model starts from `initial_kernel` and `initial_bias` and, with `l2`,
  adds Keras' `l2` weight decay on the kernel to its loss. Its input spec is
  the tuple `(x, y)`.
  """

  def __init__(self, *, seed: int, client_sizes: Mapping[str, int],
               initial_kernel: Sequence[Sequence[float]],
               initial_bias: Sequence[float], l2: Optional[float] = None,
               batch_size: int = 2):
    """Draws each client's `x` and then `y`, standard normal, in order.

    Args:
      seed: Seed of `np.random.default_rng` for the data.
      client_sizes: Examples per client id.
      initial_kernel: The `[num_features, 1]` initial kernel.
      initial_bias: The `[1]` initial bias.
      l2: The kernel's L2 regularization factor; `None`: none.
      batch_size: The batch size of `dataset`.
    """
    self.initial_kernel = np.array(initial_kernel, np.float32)
    self.initial_bias = np.array(initial_bias, np.float32)
    self.num_features = self.initial_kernel.shape[0]
    self.l2 = l2
    self.batch_size = batch_size
    rng = np.random.default_rng(seed)
    self.client_data = {
        cid: (rng.normal(size=(n, self.num_features)).astype(np.float32),
              rng.normal(size=(n, 1)).astype(np.float32))
        for cid, n in client_sizes.items()
    }

  def model_fn(self) -> tff.learning.models.VariableModel:
    """A new model at the initial weights."""
    keras_model = tf.keras.Sequential([
        tf.keras.layers.Dense(
            1, input_shape=(self.num_features,),
            kernel_initializer=tf.keras.initializers.Constant(
                self.initial_kernel),
            bias_initializer=tf.keras.initializers.Constant(
                self.initial_bias),
            kernel_regularizer=(None if self.l2 is None
                                else tf.keras.regularizers.l2(self.l2)))
    ])
    return tff.learning.models.from_keras_model(
        keras_model, loss=tf.keras.losses.MeanSquaredError(),
        input_spec=(tf.TensorSpec([None, self.num_features], tf.float32),
                    tf.TensorSpec([None, 1], tf.float32)))

  def dataset(self, client_id: str) -> tf.data.Dataset:
    """The client's examples in batches of `batch_size`."""
    return tf.data.Dataset.from_tensor_slices(
        self.client_data[client_id]).batch(self.batch_size)

  def initial_weights(self) -> np.ndarray:
    """The initial `[kernel, bias]`, flat."""
    return np.concatenate([self.initial_kernel.ravel(), self.initial_bias])

  def loss_gradient(self, theta: np.ndarray, features: np.ndarray,
                    labels: np.ndarray) -> np.ndarray:
    """Gradient of mean squared error plus `l2·‖kernel‖²` at flat `theta`."""
    l2 = self.l2 or 0.0
    kernel, bias = theta[:self.num_features], theta[self.num_features]
    residual = features @ kernel + bias - labels[:, 0]
    n = len(labels)
    return np.concatenate([
        2.0 / n * features.T @ residual + 2.0 * l2 * kernel,
        [2.0 / n * residual.sum()],
    ])


def run_stateful_rounds(
    process: Any, cohorts: Sequence[Sequence[str]],
    dataset_fn: Callable[[str], tf.data.Dataset],
    client_states: Optional[dict[str, Any]] = None,
) -> list[tuple[Any, Any, dict[str, Any]]]:
  """Runs a `StatefulClientLearningProcess` over `cohorts`.

  Client states live in `client_states` (a new dict if `None`); a client
  seen for the first time starts from `process.initial_client_state()`.

  Returns:
    Per round, `(server state, metrics, copy of client_states)`.
  """
  client_states = {} if client_states is None else client_states
  state = process.initialize()
  fresh = process.initial_client_state()
  outputs = []
  for cohort in cohorts:
    output = process.next(state, [
        stateful_process.StatefulClientInput(dataset_fn(cid),
                                             client_states.get(cid, fresh))
        for cid in cohort
    ])
    client_states.update(zip(cohort, output.client_states))
    state = output.state
    outputs.append((state, output.metrics, dict(client_states)))
  return outputs


# --- A regression task for the driver hooks' tests ---


def regression_task(
    client_sizes: Mapping[str, int], num_features: int,
    batch_size: int) -> tff.simulation.baselines.BaselineTask:
  """A `BaselineTask` of random regression clients and `linear_model_fn`.

  Train and test data are the same clients, whose `x` and then `y` are drawn
  standard normal with seed 0, client after client; both preprocess
  functions batch by `batch_size`.
  """
  rng = np.random.default_rng(0)
  client_data = tff.simulation.datasets.TestClientData({
      client_id: collections.OrderedDict(
          x=rng.normal(size=(n, num_features)).astype(np.float32),
          y=rng.normal(size=(n, 1)).astype(np.float32))
      for client_id, n in client_sizes.items()
  })
  datasets = tff.simulation.baselines.BaselineTaskDatasets(
      train_data=client_data, test_data=client_data,
      train_preprocess_fn=lambda d: d.batch(batch_size),
      eval_preprocess_fn=lambda d: d.batch(batch_size))
  return tff.simulation.baselines.BaselineTask(
      datasets, linear_model_fn(num_features))
