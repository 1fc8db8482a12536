"""BENCH.md's limit: a round's client work in plain TensorFlow, written fast.

All clients' data are constant tensors shaped `[clients, batches, batch,
...]`; one `tf.function` loops over clients and batches with `tf.range`,
resets the model to the round's start weights for each client, runs the local
SGD steps (same model, loss and learning rate as TFF's client work, Keras
`training=True`, so dropout is on) and adds each client's final weights to a
running sum. Nothing federated surrounds it: no serialization, no aggregation
process, no metrics.

Written fast includes TensorFlow's own settings. Its oneDNN graph rewrites
(`TF_ENABLE_ONEDNN_OPTS`, on by default on x86) make the CNN's and the
LSTM's limit ~1.7x faster, but a small model's ~1.7x slower (a oneDNN
primitive per small op: `_MklSoftmax` alone was half of a Synthetic step),
and TensorFlow reads the setting once, at import. So the benchmark times the
limit both ways, here and in a child process with the rewrites off
(`LimitInChild`), and takes the faster as the limit.
"""

import contextlib
import multiprocessing
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from unittest import mock

import numpy as np
import tensorflow as tf

from bench import tff_rounds
from bench import workloads
from fl_engine import runtime
from fl_common import tf_environment

# TensorFlow's switch for its oneDNN rewrites, read when it is imported.
ONEDNN_VARIABLE = tf_environment.ONEDNN
ONEDNN_OFF = {ONEDNN_VARIABLE: '0'}
onednn_setting = tf_environment.onednn_setting


def environment(values: Mapping[str, str]):
  """`os.environ` updated with `values` inside the block (what a child
  process started in it inherits), restored after."""
  return mock.patch.dict(os.environ, values)


class LimitRound:
  """One round of the limit for fixed client data; call it to run a round.

  After a call, `mean_client_weights()` is the mean of the clients' final
  weights: with equally sized clients, the FedAvg model (server SGD at 1.0)
  the same round produces.
  """

  def __init__(self, workload: workloads.Workload,
               arrays: workloads.ClientArrays):
    if workload.examples_per_client % workload.batch_size:
      raise ValueError(
          f'examples_per_client={workload.examples_per_client} is not a '
          f'multiple of batch_size={workload.batch_size}.')
    self._num_clients = arrays.num_clients
    num_batches = workload.batches_per_client
    batched_shape = (self._num_clients, num_batches, workload.batch_size)
    self._x = tf.constant(arrays.x.reshape(batched_shape + arrays.x.shape[2:]))
    self._y = tf.constant(arrays.y.reshape(batched_shape + arrays.y.shape[2:]))
    self._model = workload.keras_model_fn()
    self._loss = workload.loss_fn()
    self._learning_rate = workload.learning_rate
    self._num_batches = num_batches
    variables = self._model.trainable_variables
    self._start_weights = [tf.Variable(v) for v in variables]
    self._weight_sums = [tf.Variable(tf.zeros_like(v)) for v in variables]
    self._round = tf.function(self._build_round_fn())

  def set_start_weights(self, weights: Sequence[np.ndarray]) -> None:
    """Sets the weights every client starts the round from."""
    for variable, value in zip(self._start_weights, weights, strict=True):
      variable.assign(value)

  def mean_client_weights(self) -> list[np.ndarray]:
    """The mean over clients of their weights after the last round."""
    return [s.numpy() / self._num_clients for s in self._weight_sums]

  def __call__(self) -> None:
    self._round()

  def _build_round_fn(self) -> Callable[[], None]:
    """The round, as a new Python function (one `tf.function` per object)."""

    def round_fn() -> None:
      variables = self._model.trainable_variables
      for weight_sum in self._weight_sums:
        weight_sum.assign(tf.zeros_like(weight_sum))
      for c in tf.range(self._num_clients):
        for variable, start in zip(variables, self._start_weights):
          variable.assign(start)
        for b in tf.range(self._num_batches):
          with tf.GradientTape() as tape:
            predictions = self._model(self._x[c, b], training=True)
            loss = self._loss(self._y[c, b], predictions)
          gradients = tape.gradient(loss, variables)
          for variable, gradient in zip(variables, gradients):
            if isinstance(gradient, tf.IndexedSlices):  # embedding lookups
              variable.scatter_sub(tf.IndexedSlices(
                  self._learning_rate * gradient.values, gradient.indices,
                  gradient.dense_shape))
            else:
              variable.assign_sub(self._learning_rate * gradient)
        for weight_sum, variable in zip(self._weight_sums, variables):
          weight_sum.assign_add(variable)

    return round_fn


class ShardLimitRound(LimitRound):
  """The limit for clients of any sizes: their batches as one shard.

  `shard` is `fl_engine.shards`' format (every batch's examples
  concatenated, the batch sizes, a size-0 batch closing each client); one
  `tf.function` loops over the batches with `tf.range`, takes a local SGD
  step on each, and at each closing batch adds the client's final weights to
  a running sum and resets the model to the round's start weights. The
  plain-TensorFlow time of the client work of a fused round, on one thread.
  """

  # pylint: disable-next=super-init-not-called
  def __init__(self, keras_model_fn: Callable[[], tf.keras.Model],
               loss_fn: Callable[[], tf.keras.losses.Loss],
               learning_rate: float, shard):
    # LimitRound's weights and sums, its own data and round function.
    examples = shard['examples']
    self._x = tf.constant(examples['x'])
    self._y = tf.constant(examples['y'])
    self._batch_sizes = tf.constant(shard['batch_sizes'])
    self._num_clients = int(np.sum(shard['batch_sizes'] == 0))
    self._model = keras_model_fn()
    self._loss = loss_fn()
    self._learning_rate = learning_rate
    variables = self._model.trainable_variables
    self._start_weights = [tf.Variable(v) for v in variables]
    self._weight_sums = [tf.Variable(tf.zeros_like(v)) for v in variables]
    self._round = tf.function(self._round_fn)

  def _round_fn(self) -> None:
    variables = self._model.trainable_variables
    for weight_sum in self._weight_sums:
      weight_sum.assign(tf.zeros_like(weight_sum))
    for variable, start in zip(variables, self._start_weights):
      variable.assign(start)
    ends = tf.cumsum(self._batch_sizes)
    for i in tf.range(tf.size(self._batch_sizes)):
      size = self._batch_sizes[i]
      if size > 0:
        with tf.GradientTape() as tape:
          predictions = self._model(self._x[ends[i] - size:ends[i]],
                                    training=True)
          loss = self._loss(self._y[ends[i] - size:ends[i]], predictions)
        gradients = tape.gradient(loss, variables)
        for variable, gradient in zip(variables, gradients):
          variable.assign_sub(self._learning_rate * gradient)
      else:
        for weight_sum, variable, start in zip(self._weight_sums, variables,
                                               self._start_weights):
          weight_sum.assign_add(variable)
          variable.assign(start)


LIMIT = 'limit'
LOCAL = 'local'


def _serve_round(connection, kind: str, workload_name: str, num_clients: int,
                 seed: int) -> None:
  """A child process's loop: builds the `kind` round, runs one per request."""
  # No TFF default context here: TFF's would start a worker at exit.
  runtime.refuse_unmanaged_default_context()
  workload = workloads.get_workload(workload_name)
  arrays = workload.client_arrays(num_clients, seed)
  with contextlib.ExitStack() as stack:
    if kind == LIMIT:
      round_fn = LimitRound(workload, arrays)
    else:
      context, _ = stack.enter_context(runtime.local_context())
      stack.enter_context(runtime.install(context))
      round_fn = tff_rounds.round_for(
          tff_rounds.build_process(workload, 'resident', arrays), workload,
          arrays, 'resident')
    while True:
      request = connection.recv()
      if isinstance(request, list):
        round_fn.set_start_weights(request)
        connection.send(None)
      elif request == 'round':
        round_fn()
        connection.send(None)
      elif request == 'weights':
        connection.send(round_fn.mean_client_weights())
      elif request == 'setting':
        connection.send(onednn_setting())
      else:
        return


class RoundInChild:
  """A round of a registered workload run in a child process (spawned: a
  fresh TensorFlow) started with `env` (default: oneDNN off); call it to
  run a round there and wait for it. `kind` is `LIMIT` (`LimitRound`) or
  `LOCAL`: the `resident` TFF round of `bench.tff_rounds` on the in-process
  runtime (`fl_engine.runtime.local_context()`), the driver's
  default.

  Its clients are `workloads.get_workload(workload_name).client_arrays(
  num_clients, seed)`, the same as this process's for the same arguments.
  A call's wall time includes a pipe's round trip (tens of microseconds).
  Close it (or use it as a context manager) to end the child.

  Raises:
    ValueError: If `workload_name` is not registered or `kind` is unknown.
    RuntimeError: From a call, if the child process has ended.
  """

  def __init__(self, kind: str, workload_name: str, num_clients: int,
               seed: int = 0, env: Mapping[str, str] = ONEDNN_OFF):
    if kind not in (LIMIT, LOCAL):
      raise ValueError(f'kind must be {LIMIT!r} or {LOCAL!r}, got {kind!r}.')
    workloads.get_workload(workload_name)
    self._kind = kind
    context = multiprocessing.get_context('spawn')
    self._connection, child_end = context.Pipe()
    with environment(env):
      self._process = context.Process(
          target=_serve_round, args=(child_end, kind, workload_name,
                                     num_clients, seed), daemon=True)
      self._process.start()
    child_end.close()

  def _ask(self, request: Any) -> Any:
    try:
      self._connection.send(request)
      return self._connection.recv()
    except (EOFError, OSError) as e:
      self._process.join(timeout=5)
      raise RuntimeError(f'the {self._kind} round\'s child process ended'
                         f' (exit code {self._process.exitcode}).') from e

  def __call__(self) -> None:
    self._ask('round')

  def setting(self) -> str:
    """The child's `onednn_setting()`."""
    return self._ask('setting')

  def close(self) -> None:
    if self._process.is_alive():
      try:
        self._connection.send('stop')
      except OSError:
        pass
      self._process.join(timeout=10)
      if self._process.is_alive():
        self._process.terminate()
        self._process.join()
    self._connection.close()

  def __enter__(self) -> 'RoundInChild':
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()


class LimitInChild(RoundInChild):
  """`RoundInChild` of the limit: `LimitRound` in a child process."""

  def __init__(self, workload_name: str, num_clients: int, seed: int = 0,
               env: Mapping[str, str] = ONEDNN_OFF):
    super().__init__(LIMIT, workload_name, num_clients, seed, env)

  def set_start_weights(self, weights: Sequence[np.ndarray]) -> None:
    """As `LimitRound.set_start_weights`, in the child."""
    self._ask([np.asarray(w) for w in weights])

  def mean_client_weights(self) -> list[np.ndarray]:
    """As `LimitRound.mean_client_weights`, from the child."""
    return self._ask('weights')
