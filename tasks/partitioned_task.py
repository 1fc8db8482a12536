"""AdaBest's tasks: centralized datasets partitioned over clients.

AdaBest (Varno et al. 2022, Section 4 and supplementary D) partitions the
training split of EMNIST-L, CIFAR-10 or CIFAR-100 over 100 or 1,000 training
clients plus 10 % validation clients (IID or Dirichlet label skew, balanced or
log-normal sizes; `tasks.partition`), and evaluates on the dataset's whole
test split. 'synthetic' runs the same protocol offline on LEAF's Synthetic
data (`tasks.synthetic`): the LEAF training examples of all 1,000 clients are
pooled and re-partitioned, the LEAF test examples form the test set, and the
model is a logistic regression. 'digits' runs it offline on real images:
scikit-learn's bundled handwritten digits (`tasks.digits`) with the MLP.

Client training data (supplementary D, following FedDyn's code):
* every local epoch is a fresh shuffle of the client's examples, batch 45;
  a short last batch is filled by drawing examples uniformly, with
  replacement, from all of the client's examples (AdaBest's bootstrapping),
  so every batch is full and holds only the client's own examples;
* `num_epochs` (5) such epochs;
* images are standardized per channel with the training split's mean and
  standard deviation (FedDyn: `transforms.Normalize`), and CIFAR training
  images get, each with probability 0.5, a horizontal flip and a random
  32x32 crop of the image zero-padded by 4 pixels (FedDyn's `Dataset`; the
  padding is 0 after standardization, as there). No augmentation on
  EMNIST-L.

TFF weights a client by the examples it processed, so the bootstrapped
fillers count; they add fewer than `batch_size` examples per epoch.

Why one module: the protocol (partition, bootstrapped epochs, standardization,
augmentation, the model per dataset) is one recipe whose parts share the
dataset settings; the datasets' loaders live elsewhere (`centralized_images`,
`synthetic`, `digits`).
"""

import collections
import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tasks import adabest_models
from tasks import centralized_images
from tasks import digits
from tasks import partition
from tasks import synthetic

DEFAULT_BATCH_SIZE = 45
DEFAULT_NUM_EPOCHS = 5
DEFAULT_EVAL_BATCH_SIZE = 500
ACCURACY_METRIC_NAME = 'sparse_categorical_accuracy'
# Examples per split of the random data `use_mock_data` loads, per client.
_MOCK_EXAMPLES_PER_CLIENT = 20
_CROP_PADDING = 4
# FedDyn's and FedProx's Synthetic has 10 classes (GeL's, LEAF's default, 5).
_POOLED_SYNTHETIC_CLASSES = 10
# Moments are accumulated over this many examples at a time.
_MOMENTS_CHUNK_SIZE = 5_000

Element = collections.OrderedDict[str, tf.Tensor]


def _pooled_synthetic_data() -> tuple[
    partition.CentralizedSplit, partition.CentralizedSplit, int
]:
  """LEAF Synthetic's training and test examples, each pooled over clients."""
  clients = _synthetic_clients()
  train_clients, test_clients = synthetic.split_client_examples(
      clients, synthetic.LEAF_SEED
  )

  def pool(client_arrays: list[synthetic.ClientArrays]) -> (
      partition.CentralizedSplit
  ):
    return partition.CentralizedSplit(
        x=np.concatenate([x for x, _ in client_arrays]),
        y=np.concatenate([y for _, y in client_arrays]),
    )

  return pool(train_clients), pool(test_clients), _POOLED_SYNTHETIC_CLASSES


def _synthetic_clients() -> list[synthetic.ClientArrays]:
  """The LEAF clients `_pooled_synthetic_data` pools (FedDyn's 10 classes)."""
  return synthetic.generate_synthetic_clients(
      num_clients=synthetic.NUM_CLIENTS, num_classes=_POOLED_SYNTHETIC_CLASSES
  )


def generate_common_data() -> None:
  """Generates the clients `_pooled_synthetic_data` pools into
  `synthetic`'s cache (`tasks.generate_common_data`)."""
  _synthetic_clients()


@dataclasses.dataclass(frozen=True)
class DatasetSettings:
  """What differs between AdaBest's datasets (Section 4, supplementary D).

  Attributes:
    weight_decay: SGD weight decay of the local optimizer, built into the
      model as L2 regularization (`tasks.adabest_models`).
    create_keras_model: Builds the model from `input_shape`, `num_classes`
      and `weight_decay` keywords.
    standardize_inputs: Whether inputs are standardized per channel.
    augment_train_images: Whether training images get flips and crops.
    other_models: Further model choices by name (`model=` of
      `create_partitioned_task`), besides the default.
    load: For data held in memory: `() -> (train, test, num_classes)`, the
      centralized splits as `partition.CentralizedSplit`s; None: a TFDS image
      dataset of `tasks.centralized_images` (downloaded on first use).
  """

  weight_decay: float
  create_keras_model: Callable[..., tf.keras.Model]
  standardize_inputs: bool
  augment_train_images: bool
  other_models: Mapping[str, Callable[..., tf.keras.Model]] = (
      dataclasses.field(default_factory=dict))
  load: Optional[Callable[[], tuple[partition.CentralizedSplit,
                                    partition.CentralizedSplit, int]]] = None


# Digits' `wide_mlp`: AdaBest's MLP widened to ~1.1M parameters, the order
# of AdaBest's CIFAR CNN (833k), where an elementwise pass over the
# parameters no longer fits in a core's cache (what AdaBest's cost tables
# count: `reproduce` adabest table_cost).
WIDE_MLP_UNITS = (1024, 1024)

DATASET_SETTINGS: dict[str, DatasetSettings] = {
    'emnist_l': DatasetSettings(
        weight_decay=1e-4,
        create_keras_model=adabest_models.create_mlp,
        standardize_inputs=True,
        augment_train_images=False,
    ),
    'cifar10': DatasetSettings(
        weight_decay=1e-3,
        create_keras_model=adabest_models.create_cnn,
        standardize_inputs=True,
        augment_train_images=True,
    ),
    'cifar100': DatasetSettings(
        weight_decay=1e-3,
        create_keras_model=adabest_models.create_cnn,
        standardize_inputs=True,
        augment_train_images=True,
    ),
    # scikit-learn's bundled digits (`tasks.digits`): EMNIST-L's MLP.
    'digits': DatasetSettings(
        weight_decay=1e-4,
        create_keras_model=adabest_models.create_mlp,
        standardize_inputs=True,
        augment_train_images=False,
        other_models={'mlp': adabest_models.create_mlp,
                      'cnn': adabest_models.create_small_cnn,
                      'wide_mlp': functools.partial(
                          adabest_models.create_mlp,
                          hidden_units=WIDE_MLP_UNITS)},
        load=digits.load_splits,
    ),
    # FedDyn's synthetic experiments: weight decay 1e-5, raw features.
    'synthetic': DatasetSettings(
        weight_decay=1e-5,
        create_keras_model=adabest_models.create_logistic_regression,
        standardize_inputs=False,
        augment_train_images=False,
        load=_pooled_synthetic_data,
    ),
}


def create_partitioned_task(
    dataset: str,
    *,
    num_clients: int = 100,
    dirichlet_alpha: Optional[float] = None,
    unbalanced_sigma: float = 0.0,
    partition_seed: int = 0,
    batch_size: int = DEFAULT_BATCH_SIZE,
    num_epochs: int = DEFAULT_NUM_EPOCHS,
    eval_batch_size: int = DEFAULT_EVAL_BATCH_SIZE,
    data_dir: Optional[str] = None,
    use_mock_data: bool = False,
    model: Optional[str] = None,
) -> tff.simulation.baselines.BaselineTask:
  """Builds one of AdaBest's partitioned tasks.

  Args:
    dataset: 'emnist_l', 'cifar10', 'cifar100', 'digits' or 'synthetic'.
    num_clients: Training clients; `round(0.1 * num_clients)` validation
      clients are partitioned from the same training split.
    dirichlet_alpha: Concentration of the per-client label proportions
      (AdaBest: 0.3 or 0.03); None is IID.
    unbalanced_sigma: Sigma of the log-normal client sizes (AdaBest's
      unbalanced setting: 0.3); 0 is balanced.
    partition_seed: Seed of the partition (AdaBest repeats 5 seeds).
    batch_size: Client batch size (AdaBest: 45).
    num_epochs: Local epochs per round (AdaBest: 5).
    eval_batch_size: Batch size of the test and validation data.
    data_dir: Directory TFDS prepared the image dataset in (see
      `tasks.centralized_images`); unused by 'synthetic' and 'digits'.
    use_mock_data: Use random images (20 per client in each split) instead
      of TFDS files; 'synthetic' (generated) and 'digits' (bundled) ignore
      it.
    model: None (the paper's model for the dataset), or one of the
      dataset's `other_models` ('digits': 'cnn', a small CNN; 'wide_mlp',
      the MLP at `WIDE_MLP_UNITS`).

  Returns:
    A `tff.simulation.baselines.BaselineTask` whose `datasets.train_data`
    are the training clients, `validation_data` the validation clients (None
    if there are none), `test_data` the centralized test split, and whose
    model outputs logits.

  Raises:
    ValueError: If `dataset` is unknown or an argument is out of range.
    MissingDataError: If the image dataset is not in `data_dir`.
  """
  if dataset not in DATASET_SETTINGS:
    raise ValueError(
        f'Unknown dataset {dataset!r}; expected one of'
        f' {sorted(DATASET_SETTINGS)}.'
    )
  for name, value in (('batch_size', batch_size), ('num_epochs', num_epochs),
                      ('eval_batch_size', eval_batch_size)):
    if not isinstance(value, int) or value < 1:
      raise ValueError(f'{name} must be a positive int, got {value}.')
  settings = DATASET_SETTINGS[dataset]
  if model is not None and model not in settings.other_models:
    raise ValueError(
        f'model must be None or one of {sorted(settings.other_models)} for'
        f' {dataset!r}, got {model!r}.')
  create_keras_model = (settings.other_models[model] if model is not None
                        else settings.create_keras_model)
  if settings.load is not None:
    train, test, num_classes = settings.load()
  else:
    num_classes = centralized_images.IMAGE_DATASETS[dataset].num_classes
    if use_mock_data:
      total_clients = num_clients + round(
          partition.VALIDATION_CLIENT_FRACTION * num_clients
      )
      with centralized_images.mock_image_data(
          _MOCK_EXAMPLES_PER_CLIENT * total_clients
      ):
        train, test = centralized_images.load_image_dataset(dataset)
    else:
      train, test = centralized_images.load_image_dataset(
          dataset, data_dir=data_dir
      )
  clients = partition.partition_dataset(
      train.y,
      num_clients=num_clients,
      dirichlet_alpha=dirichlet_alpha,
      unbalanced_sigma=unbalanced_sigma,
      partition_seed=partition_seed,
  )
  train_examples = collections.OrderedDict(x=train.x, y=train.y)
  if settings.standardize_inputs:
    mean, stddev = _channel_moments(train.x)
  else:
    mean, stddev = 0.0, 1.0

  def prepare(element: Element) -> Element:
    x = (tf.cast(element['x'], tf.float32) - mean) / stddev
    return collections.OrderedDict(x=x, y=element['y'])

  def prepare_arrays(examples: Element) -> Element:  # `prepare` in NumPy.
    x = (examples['x'].astype(np.float32) - mean) / stddev
    return collections.OrderedDict(x=x.astype(np.float32), y=examples['y'])

  def train_preprocess_fn(client_dataset: tf.data.Dataset) -> tf.data.Dataset:
    examples = bootstrapped_epochs(
        client_dataset, batch_size=batch_size, num_epochs=num_epochs
    )
    if settings.augment_train_images:
      # Stateless augmentation from a per-dataset seed (as in
      # `bootstrapped_epochs`): unseeded ops in the map function would
      # augment every client's k-th example alike.
      augment_seed = _new_dataset_seed()

      def prepare_for_training(index, element):
        element = prepare(element)
        element['x'] = augment_image(
            element['x'],
            tf.random.experimental.stateless_fold_in(augment_seed, index),
        )
        return element

      examples = examples.enumerate()
    else:
      prepare_for_training = prepare
    return examples.map(
        prepare_for_training, num_parallel_calls=tf.data.AUTOTUNE
    ).batch(batch_size)

  def eval_preprocess_fn(eval_dataset: tf.data.Dataset) -> tf.data.Dataset:
    return eval_dataset.map(prepare).batch(eval_batch_size)

  # The same pipelines for `fl_engine.shards.shards_from_arrays` (the
  # fields of its `BatchRecipe`), which batches clients in NumPy; with
  # augmentation (TF's stateless image ops), the tf.data pipeline is used.
  if not settings.augment_train_images:
    train_preprocess_fn.batch_recipe = dict(
        batch_size=batch_size, num_epochs=num_epochs, fill_last_batch=True,
        transform=prepare_arrays)
  eval_preprocess_fn.batch_recipe = dict(
      batch_size=eval_batch_size, shuffle=False, transform=prepare_arrays)

  task_datasets = tff.simulation.baselines.BaselineTaskDatasets(
      train_data=partition.create_client_data(
          train_examples, clients.train_clients
      ),
      test_data=tf.data.Dataset.from_tensor_slices(
          collections.OrderedDict(x=test.x, y=test.y)
      ),
      validation_data=(
          partition.create_client_data(
              train_examples, clients.validation_clients
          )
          if clients.validation_clients
          else None
      ),
      train_preprocess_fn=train_preprocess_fn,
      eval_preprocess_fn=eval_preprocess_fn,
  )
  input_shape = train.x.shape[1:]

  def model_fn() -> tff.learning.models.VariableModel:
    return tff.learning.models.from_keras_model(
        keras_model=create_keras_model(
            input_shape=input_shape,
            num_classes=num_classes,
            weight_decay=settings.weight_decay,
        ),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        input_spec=task_datasets.element_type_structure,
        metrics=[tf.keras.metrics.SparseCategoricalAccuracy()],
    )

  return tff.simulation.baselines.BaselineTask(task_datasets, model_fn)


def _new_dataset_seed() -> tf.Tensor:
  """A shape `[2]` int64 seed for one dataset's stateless random ops, drawn
  from TF's global random stream (so `tf.random.set_seed` reproduces it)."""
  return tf.random.uniform(
      [2], minval=tf.int64.min, maxval=tf.int64.max, dtype=tf.int64
  )


# A batch size no client reaches: one batch holds all of a client's examples.
_ALL_EXAMPLES = np.iinfo(np.int64).max


def bootstrapped_epochs(
    client_dataset: tf.data.Dataset, *, batch_size: int, num_epochs: int
) -> tf.data.Dataset:
  """`num_epochs` shuffled passes over a client's examples, padded to batches.

  Each epoch is a fresh permutation of the client's `n` examples followed by
  `(-n) mod batch_size` examples drawn uniformly with replacement from all
  `n`, so batching the result by `batch_size` gives only full batches, none
  straddling two epochs (AdaBest, supplementary D).

  Args:
    client_dataset: One client's unbatched examples.
    batch_size: The batch size the result will be batched by.
    num_epochs: Number of epochs.

  The draws are stateless, from one seed drawn from TF's global random
  stream when this function is called: each call (each client of a round)
  gets its own permutations, and under `tf.random.set_seed` the same calls
  in the same order give the same datasets, wherever they are iterated.
  (Unseeded random ops inside the `flat_map` function would all take the
  same seed from the outer graph: equally sized clients would then be
  shuffled alike.)

  `n` is counted inside the pipeline, from the one element holding all of the
  client's examples. (Counted eagerly with `Dataset.reduce` when the dataset
  is built, each client dataset left a traced function behind in the driver:
  ~75 kB per dataset that no cache clearing freed.)

  Returns:
    An unbatched dataset of `num_epochs * ceil(n / batch_size) * batch_size`
    examples (none if the client has none).
  """
  dataset_seed = _new_dataset_seed()

  def epochs_of(examples: Element) -> tf.data.Dataset:
    num_examples = tf.shape(
        tf.nest.flatten(examples)[0], out_type=tf.int64)[0]
    num_fillers = tf.math.floormod(-num_examples, batch_size)

    def one_epoch(epoch: tf.Tensor) -> tf.data.Dataset:
      shuffle_seed, filler_seed = tf.unstack(
          tf.random.experimental.stateless_split(
              tf.random.experimental.stateless_fold_in(dataset_seed, epoch),
              num=2,
          )
      )
      order = tf.concat(
          [
              tf.random.experimental.stateless_shuffle(
                  tf.range(num_examples), seed=shuffle_seed
              ),
              tf.random.stateless_uniform(
                  [num_fillers],
                  seed=filler_seed,
                  minval=tf.constant(0, tf.int64),
                  maxval=num_examples,
                  dtype=tf.int64,
              ),
          ],
          axis=0,
      )
      return tf.data.Dataset.from_tensor_slices(
          tf.nest.map_structure(lambda t: tf.gather(t, order), examples)
      )

    return tf.data.Dataset.range(num_epochs).flat_map(one_epoch)

  # One element holding all of the client's examples (none if it has none).
  all_examples = client_dataset.batch(_ALL_EXAMPLES)
  return all_examples.flat_map(epochs_of)


def augment_image(image: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
  """FedDyn's CIFAR augmentation: flip and pad-4 crop, each with p = 0.5.

  Args:
    image: One `[height, width, channels]` image.
    seed: A shape `[2]` integer seed; the draws are stateless, so the same
      seed gives the same augmentation.
  """
  flip_seed, crop_seed, choice_seed = tf.unstack(
      tf.random.experimental.stateless_split(seed, num=3))
  image = tf.image.stateless_random_flip_left_right(image, seed=flip_seed)
  padding = [[_CROP_PADDING, _CROP_PADDING], [_CROP_PADDING, _CROP_PADDING],
             [0, 0]]
  cropped = tf.image.stateless_random_crop(
      tf.pad(image, padding), tf.shape(image), seed=crop_seed)
  return tf.cond(
      tf.random.stateless_uniform([], seed=choice_seed) < 0.5,
      lambda: cropped, lambda: image)


def _channel_moments(images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Per-channel mean and standard deviation, in float32, without a copy."""
  num_channels = images.shape[-1]
  total = np.zeros(num_channels)
  total_of_squares = np.zeros(num_channels)
  for start in range(0, len(images), _MOMENTS_CHUNK_SIZE):
    chunk = images[start:start + _MOMENTS_CHUNK_SIZE].reshape(
        -1, num_channels
    ).astype(np.float64)
    total += chunk.sum(axis=0)
    total_of_squares += np.square(chunk).sum(axis=0)
  count = images.size // num_channels
  mean = total / count
  stddev = np.sqrt(np.maximum(total_of_squares / count - mean**2, 0.0))
  return mean.astype(np.float32), np.maximum(stddev, 1e-6).astype(np.float32)
