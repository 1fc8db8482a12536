"""Round time of the package's TFF rounds against "the limit" (BENCH.md).

    python -m bench.round_time --cohorts=10,50

Workload (BENCH.md): FedAvg round, EMNIST CNN with dropout (TFF's
`cnn_dropout`, 62 classes), each client 100 random 28x28x1 examples, batch
20, one local epoch of SGD lr 0.1, server averages. Measured side by side in
one process: warm-up call, then the minimum of `--repeats` timed calls.

* limit: plain TensorFlow, all clients' data as one constant tensor
  `[clients, batches, batch, ...]`, one `tf.function` looping over clients and
  batches with `tf.range`, resetting the model to the round's start weights per
  client, summing the final weights;
* tff_mean: `large_cohort.fedopt.build_fedopt` with TFF's plain mean
  aggregator, on the package's local runtime;
* tff_package: the same with the driver's default aggregator (adaptive
  clipping).

Prints one row per cohort size with each time and its ratio to the limit.
"""

import collections
import os
import time
from collections.abc import Callable, Sequence

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.simulation.baselines.emnist import emnist_models

from experiment_driver import runtime
from large_cohort import fedopt
from large_cohort import optimizers

_COHORTS = flags.DEFINE_list('cohorts', ['10', '50'], 'Cohort sizes to time.')
_REPEATS = flags.DEFINE_integer('repeats', 3, 'Timed calls per measurement.')

EXAMPLES_PER_CLIENT = 100
BATCH_SIZE = 20
LEARNING_RATE = 0.1
NUM_CLASSES = 62


def _client_arrays(num_clients: int, seed: int = 0):
  rng = np.random.default_rng(seed)
  x = rng.random((num_clients, EXAMPLES_PER_CLIENT, 28, 28, 1), np.float32)
  y = rng.integers(0, NUM_CLASSES, (num_clients, EXAMPLES_PER_CLIENT, 1))
  return x, y.astype(np.int32)


def _keras_model() -> tf.keras.Model:
  return emnist_models.create_conv_dropout_model(only_digits=False)


def build_limit_round(x: np.ndarray, y: np.ndarray) -> Callable[[], None]:
  """BENCH.md's limit: one graph looping over clients and batches."""
  num_clients = x.shape[0]
  num_batches = EXAMPLES_PER_CLIENT // BATCH_SIZE
  x_batched = tf.constant(
      x.reshape(num_clients, num_batches, BATCH_SIZE, 28, 28, 1))
  y_batched = tf.constant(y.reshape(num_clients, num_batches, BATCH_SIZE, 1))
  model = _keras_model()
  loss_fn = tf.keras.losses.SparseCategoricalCrossentropy()
  start_weights = [tf.Variable(v) for v in model.trainable_variables]
  weight_sums = [tf.Variable(tf.zeros_like(v)) for v in start_weights]

  @tf.function
  def round_fn():
    for s in weight_sums:
      s.assign(tf.zeros_like(s))
    for c in tf.range(num_clients):
      for v, w in zip(model.trainable_variables, start_weights):
        v.assign(w)
      for b in tf.range(num_batches):
        with tf.GradientTape() as tape:
          predictions = model(x_batched[c, b], training=True)
          loss = loss_fn(y_batched[c, b], predictions)
        gradients = tape.gradient(loss, model.trainable_variables)
        for v, g in zip(model.trainable_variables, gradients):
          v.assign_sub(LEARNING_RATE * g)
      for s, v in zip(weight_sums, model.trainable_variables):
        s.assign_add(v)

  return round_fn


def _model_fn_for(element_spec):
  def model_fn():
    return tff.learning.models.from_keras_model(
        _keras_model(),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(),
        input_spec=element_spec,
        metrics=[tf.keras.metrics.SparseCategoricalAccuracy()])
  return model_fn


def build_tff_round(x: np.ndarray, y: np.ndarray,
                    model_aggregator) -> Callable[[], None]:
  """One FedOpt round (server SGD lr 1 = FedAvg) on the package runtime."""
  datasets = [
      tf.data.Dataset.from_tensor_slices(
          collections.OrderedDict(x=x[c], y=y[c])).batch(BATCH_SIZE)
      for c in range(x.shape[0])
  ]
  process = fedopt.build_fedopt(
      _model_fn_for(datasets[0].element_spec),
      client_optimizer=optimizers.build_optimizer('sgd', LEARNING_RATE),
      server_optimizer=optimizers.build_optimizer('sgd', 1.0),
      model_aggregator=model_aggregator)
  state = process.initialize()

  def round_fn():
    process.next(state, datasets)

  return round_fn


def best_time(round_fn: Callable[[], None], repeats: int) -> float:
  round_fn()  # warm-up: tracing, worker start-up
  times = []
  for _ in range(repeats):
    started = time.perf_counter()
    round_fn()
    times.append(time.perf_counter() - started)
  return min(times)


def measure(cohorts: Sequence[int], repeats: int) -> list[dict[str, float]]:
  rows = []
  for num_clients in cohorts:
    x, y = _client_arrays(num_clients)
    row = {'clients': num_clients,
           'limit': best_time(build_limit_round(x, y), repeats),
           'tff_mean': best_time(build_tff_round(x, y, None), repeats),
           'tff_package': best_time(build_tff_round(
               x, y, tff.learning.robust_aggregator(zeroing=False)), repeats)}
    rows.append(row)
  return rows


def main(argv):
  del argv
  cohorts = [int(c) for c in _COHORTS.value]
  with runtime.local_runtime():
    rows = measure(cohorts, _REPEATS.value)
  print(f'{"clients":>8} {"limit s":>9} {"tff_mean s":>11} {"ratio":>6} '
        f'{"tff_package s":>14} {"ratio":>6}')
  for r in rows:
    print(f'{r["clients"]:>8} {r["limit"]:>9.3f} {r["tff_mean"]:>11.3f} '
          f'{r["tff_mean"] / r["limit"]:>6.2f} {r["tff_package"]:>14.3f} '
          f'{r["tff_package"] / r["limit"]:>6.2f}')


if __name__ == '__main__':
  app.run(main)
