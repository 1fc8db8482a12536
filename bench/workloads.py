"""The benchmark workloads: a model, its loss, and synthetic client data.

Each `Workload` is one client's work of a FedAvg round as BENCH.md defines
it (same model, loss, learning rate and batch size in the limit and in TFF):

* `emnist_cnn` — BENCH.md's reference: TFF's EMNIST CNN with dropout
  (`emnist_models.create_conv_dropout_model`, 62 classes), 100 random
  28x28x1 examples per client, batch 20, one epoch of SGD at 0.1.
* `stackoverflow_lstm` — TFF's baseline Stack Overflow next-word model
  (`word_prediction_models.create_recurrent_model`: vocabulary 10,000 + 4
  special tokens, embedding 96, one LSTM of 670, dense 96, 10,004 logits),
  random token sequences of length 20, one batch of 32 per client (one step:
  the model is ~100x the CNN's cost per example), SGD at 0.1.
* `emnist_2nn` — TFF's two-hidden-layer EMNIST model (784-200-200-62,
  0.8 MB of weights), and `emnist_linear`, a softmax regression on the 784
  pixels (0.2 MB), for the memory benchmark at 1,000 clients per round: the
  CNN's 4.8 MB of weights would be held several times per client (updates,
  AdaBest's per-client state, ...), more than this machine's memory.

Client data are NumPy arrays shaped `[clients, examples, ...]`; the limit
reshapes them into batches, TFF gets one `tf.data.Dataset` per client,
prebuilt or built each round from a `ClientData` as the training loop does.
"""

import collections
import dataclasses
from collections.abc import Callable

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from fl_common.tff_private import emnist_models
from fl_common.tff_private import word_prediction_models

# The name of the accuracy metric every workload's TFF model reports.
ACCURACY_METRIC_NAME = 'sparse_categorical_accuracy'
EMNIST_CLASSES = 62
# Stack Overflow's extended vocabulary: 10,000 words, pad, one
# out-of-vocabulary bucket, beginning and end of sentence.
STACKOVERFLOW_VOCAB = 10_000 + 4
STACKOVERFLOW_SEQUENCE_LENGTH = 20


@dataclasses.dataclass(frozen=True)
class ClientArrays:
  """All clients' examples: `x[c]`, `y[c]` are client `c`'s."""

  x: np.ndarray
  y: np.ndarray

  @property
  def num_clients(self) -> int:
    return self.x.shape[0]


@dataclasses.dataclass(frozen=True)
class Workload:
  """One client's work in a FedAvg round, and how to make its data.

  Attributes:
    name: The name used on the command line and in the tables.
    keras_model_fn: A no-arg function returning a new Keras model.
    loss_fn: A no-arg function returning the training loss.
    make_examples: `(rng, num_clients, examples_per_client) -> (x, y)`.
    examples_per_client: Examples per client (a multiple of `batch_size`).
    batch_size: The client batch size.
    learning_rate: The client SGD learning rate.
  """

  name: str
  keras_model_fn: Callable[[], tf.keras.Model]
  loss_fn: Callable[[], tf.keras.losses.Loss]
  make_examples: Callable[[np.random.Generator, int, int],
                          tuple[np.ndarray, np.ndarray]]
  examples_per_client: int
  batch_size: int
  learning_rate: float = 0.1

  @property
  def batches_per_client(self) -> int:
    return self.examples_per_client // self.batch_size

  def client_arrays(self, num_clients: int, seed: int = 0) -> ClientArrays:
    """Random examples for `num_clients` clients.

    Raises:
      ValueError: If `num_clients` is not positive.
    """
    if num_clients < 1:
      raise ValueError(f'num_clients must be positive, got {num_clients}.')
    x, y = self.make_examples(np.random.default_rng(seed), num_clients,
                              self.examples_per_client)
    return ClientArrays(x, y)

  def client_datasets(self, arrays: ClientArrays) -> list[tf.data.Dataset]:
    """One batched dataset per client, as TFF's client work consumes them."""
    return [
        self.preprocess(tf.data.Dataset.from_tensor_slices(
            collections.OrderedDict(x=arrays.x[c], y=arrays.y[c])))
        for c in range(arrays.num_clients)
    ]

  def client_data(
      self, arrays: ClientArrays) -> tff.simulation.datasets.ClientData:
    """The clients as a TFF `ClientData` (ids "0", "1", ...), unbatched."""
    return tff.simulation.datasets.TestClientData({
        str(c): collections.OrderedDict(x=arrays.x[c], y=arrays.y[c])
        for c in range(arrays.num_clients)
    })

  def preprocess(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
    """A client's training pipeline: batches of `batch_size`."""
    return dataset.batch(self.batch_size)

  def element_spec(self) -> collections.OrderedDict:
    """The element spec of `client_datasets`' datasets."""
    x, y = self.make_examples(np.random.default_rng(0), 1, self.batch_size)
    return collections.OrderedDict(
        x=tf.TensorSpec((None,) + x.shape[2:], tf.as_dtype(x.dtype)),
        y=tf.TensorSpec((None,) + y.shape[2:], tf.as_dtype(y.dtype)))

  def tff_model_fn(self) -> Callable[[], tff.learning.models.VariableModel]:
    """A TFF `model_fn` wrapping `keras_model_fn` with `loss_fn`."""
    input_spec = self.element_spec()

    def model_fn() -> tff.learning.models.VariableModel:
      return tff.learning.models.from_keras_model(
          self.keras_model_fn(),
          loss=self.loss_fn(),
          input_spec=input_spec,
          metrics=[tf.keras.metrics.SparseCategoricalAccuracy()])

    return model_fn


def _emnist_examples(rng, num_clients, examples_per_client):
  x = rng.random((num_clients, examples_per_client, 28, 28, 1), np.float32)
  y = rng.integers(0, EMNIST_CLASSES, (num_clients, examples_per_client, 1))
  return x, y.astype(np.int32)


def _token_examples(rng, num_clients, examples_per_client):
  # Sentences of ids in [1, vocab): the input is a sentence without its last
  # token, the label the same sentence shifted by one (next-word prediction).
  tokens = rng.integers(
      1, STACKOVERFLOW_VOCAB,
      (num_clients, examples_per_client, STACKOVERFLOW_SEQUENCE_LENGTH + 1))
  return tokens[..., :-1].astype(np.int64), tokens[..., 1:].astype(np.int64)


EMNIST_CNN = Workload(
    name='emnist_cnn',
    keras_model_fn=lambda: emnist_models.create_conv_dropout_model(
        only_digits=False),
    loss_fn=tf.keras.losses.SparseCategoricalCrossentropy,
    make_examples=_emnist_examples,
    examples_per_client=100,
    batch_size=20,
)

STACKOVERFLOW_LSTM = Workload(
    name='stackoverflow_lstm',
    keras_model_fn=lambda: word_prediction_models.create_recurrent_model(
        vocab_size=STACKOVERFLOW_VOCAB, embedding_size=96, num_lstm_layers=1,
        lstm_size=670),
    loss_fn=lambda: tf.keras.losses.SparseCategoricalCrossentropy(
        from_logits=True),
    make_examples=_token_examples,
    examples_per_client=32,
    batch_size=32,
)

EMNIST_2NN = Workload(
    name='emnist_2nn',
    keras_model_fn=lambda: emnist_models.create_two_hidden_layer_model(
        only_digits=False),
    loss_fn=tf.keras.losses.SparseCategoricalCrossentropy,
    make_examples=_emnist_examples,
    examples_per_client=100,
    batch_size=20,
)

EMNIST_LINEAR = Workload(
    name='emnist_linear',
    keras_model_fn=lambda: tf.keras.Sequential([
        tf.keras.layers.Reshape((28 * 28,), input_shape=(28, 28, 1)),
        tf.keras.layers.Dense(EMNIST_CLASSES, activation='softmax')]),
    loss_fn=tf.keras.losses.SparseCategoricalCrossentropy,
    make_examples=_emnist_examples,
    examples_per_client=100,
    batch_size=20,
)

def _synthetic_examples(rng, num_clients, examples_per_client):
  x = rng.normal(size=(num_clients, examples_per_client, 60)).astype(
      np.float32)
  y = rng.integers(0, 5, (num_clients, examples_per_client, 1))
  return x, y.astype(np.int32)


# LEAF Synthetic's shape (GeL's Table 1: 60 features, 5 classes, 305
# parameters) at GeL's batch size 5, 20 examples per client.
SYNTHETIC_LR = Workload(
    name='synthetic_lr',
    keras_model_fn=lambda: tf.keras.Sequential([
        tf.keras.layers.Dense(5, activation='softmax', input_shape=(60,))]),
    loss_fn=tf.keras.losses.SparseCategoricalCrossentropy,
    make_examples=_synthetic_examples,
    examples_per_client=20,
    batch_size=5,
)

WORKLOADS = {
    w.name: w
    for w in (EMNIST_CNN, STACKOVERFLOW_LSTM, EMNIST_2NN, EMNIST_LINEAR,
              SYNTHETIC_LR)
}


def get_workload(name: str) -> Workload:
  """The workload called `name`.

  Raises:
    ValueError: If there is no such workload.
  """
  if name not in WORKLOADS:
    raise ValueError(
        f'Unknown workload {name!r}; expected one of {sorted(WORKLOADS)}.')
  return WORKLOADS[name]
