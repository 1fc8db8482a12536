"""LEAF's Synthetic dataset (GeL's "Synthetic" task), generated in NumPy.

GeL (Boukhari et al. 2024, Table 4) trains a logistic regression on LEAF's
Synthetic data (Caldas et al. 2019): 1,000 clients, 96,374 training samples,
median 22 per client. LEAF's generator (`data/synthetic/main.py` and
`data_generator.py`, an extension of FedProx's Synthetic(α, β) of Li et al.
2020) with its default seed 931231 and LEAF's per-client 90/10 train/test
split reproduces exactly those counts: 107,553 samples in all, 96,374 in the
training split, whose median client holds 22.5. `generate_synthetic_clients`
is that generator, step for step and with LEAF's random stream, so the same
seed gives LEAF's data:

1. Client sizes: `n_k = min(floor(LogNormal(3, 2)) + 5, 1000)` (power law).
2. Re-seed. A shared tensor `Q ~ N(0, 1)` of shape (d + 1, C, 1), a feature
   covariance `Σ = diag(j^-1.2)`, a cluster center `μ ~ N(N(0, 1), 1)`
   (LEAF's single cluster, `PROB_CLUSTERS = [1.0]`).
3. Per client k: `B_k ~ N(0, β)`, feature mean `v_k ~ N(B_k, 1)` (d-dim),
   `x ~ N(v_k, Σ)`; model scale `m_k ~ N(μ, α)`, `W_k = Q m_k` (its first row
   is the bias); labels `y = argmax_c softmax([1, x] W_k + N(0, 0.1²))_c`.

Two readings, stated:
* α and β: LEAF hard-codes the spread of `m_k` (0.1) and of `B_k` (1); we
  expose them as `alpha` (model heterogeneity: how far each client's model
  is from the shared one) and `beta` (data heterogeneity: how far each
  client's features are from the others'), the roles α and β play in
  FedProx's Synthetic(α, β). FedProx draws each client's weights
  independently around a N(0, α) mean instead; GeL's counts are LEAF's, so
  LEAF's construction is kept and its values are the defaults.
* Labels: LEAF's first generator normalized its softmax over the client's
  samples (`exp(s) / sum(exp(s))`), which adds a per-client class offset;
  its later one (LEAF's master) uses `scipy.special.softmax(s, axis=1)`,
  over classes. We follow the later one: `y = argmax_c s_c` (the softmax
  does not change the argmax), so one linear model labels every client up
  to its scale `m_k` and the 0.1 noise.

Misaligned clients (`misaligned_fraction`, off by default): a mechanism test
of the large-cohort paper's Section 3.1, where catastrophic failures come
from clients whose loss is misaligned with the server model, so that their
gradient at it blows up, and a larger cohort samples one more often
(`P = 1 - (1 - f)^M`). A seeded, fixed `round(f n)` of the clients (at least
one) take the label their own model ranks last (`argmin` of the scores:
opposite to every other client's labelling) and features scaled by
`misaligned_scale`; the other clients' data are LEAF's, draw for draw.

Classes: LEAF's README generates 5 classes, FedProx 10. GeL trains on LEAF's
with 5: its Table 1 counts 305 parameters, 60 features x 5 classes + 5 biases.
LEAF's 5 is the default (`num_classes`; the driver's
`--synthetic_num_classes`), so GeL's Table 1 setting is the default task.
AdaBest's pooled `synthetic_partitioned` task keeps FedDyn's and FedProx's
10. Features: 60.

`create_synthetic_task` splits each client 90/10 into train/test examples as
LEAF does (`num_train = floor(0.9 n_k)`, a seeded random subset), holds out
`validation_fraction` of the training clients for validation, and pairs the
data with a logistic regression: Dense(num_classes) logits on 60 features,
zero initialized, sparse categorical cross-entropy computed from the logits,
accuracy metric. From the logits, not from a softmax output: Keras'
cross-entropy on probabilities clips them at 1e-7, which zeroes the gradient
of every example whose label the model rules out, so a misaligned client (a
label the model ranks last, large features) sent an update of exactly zero
(at `misaligned_scale` 100, ‖Δ‖ = 0 after an epoch, against 236 from the
logits) and the mechanism it tests never reached the server. Elsewhere the
two are the same function.

Client learning rate (`CLIENT_LEARNING_RATE`), tuned on the 10-class variant:
FedAvg with server SGD lr 1,
10 clients per round, batch 5, 1 epoch, 800 training clients (the default
20 % validation split), test accuracy over all clients' test examples
(majority class: 28.0 %) after 100 rounds, for client SGD rates 0.003, 0.01,
0.03, 0.1, 0.3: 64.2, 66.4, 69.6, 71.0, 68.6 %. 0.1 is best, and is GeL's
tuned FedAvg rate (its Table 5); its curve at rounds 10/30/50/70/100:
41.0, 59.2, 56.8, 67.9, 71.0 %.

Why one module: the generator, LEAF's per-client split and the TFF task
share LEAF's constants and random stream.
"""

import collections
import functools
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tasks import array_client_data
from tasks import tff_tasks
from tasks import validation_split

ACCURACY_METRIC_NAME = 'sparse_categorical_accuracy'
DEFAULT_TRAIN_BATCH_SIZE = 5
DEFAULT_EVAL_BATCH_SIZE = 64
# FedAvg's client SGD learning rate for this task (module docstring).
CLIENT_LEARNING_RATE = 0.1
LEAF_SEED = 931231
NUM_CLIENTS = 1000
NUM_FEATURES = 60
NUM_CLASSES = 5  # LEAF's (and GeL's Table 1: 305 parameters)
LEAF_ALPHA = 0.1
LEAF_BETA = 1.0
TRAIN_FRACTION = 0.9
MIN_CLIENT_EXAMPLES = 5
MAX_CLIENT_EXAMPLES = 1000
_LOG_SIZE_MEAN = 3.0
_LOG_SIZE_SIGMA = 2.0
_FEATURE_COVARIANCE_EXPONENT = -1.2
_LABEL_NOISE_STDDEV = 0.1
# Misaligned clients (module docstring): their features' scale by default,
# and the offset of the seed that picks them from LEAF's stream.
MISALIGNED_SCALE = 10.0
_MISALIGNED_SEED_OFFSET = 1

ClientArrays = tuple[np.ndarray, np.ndarray]


def _client_sizes(num_clients: int, seed: int) -> np.ndarray:
  """LEAF's `get_num_samples`: log-normal sizes, shifted and capped."""
  sizes = np.random.RandomState(seed).lognormal(
      _LOG_SIZE_MEAN, _LOG_SIZE_SIGMA, num_clients
  ).astype(int)
  return np.minimum(sizes + MIN_CLIENT_EXAMPLES, MAX_CLIENT_EXAMPLES)


def generate_synthetic_clients(
    num_clients: int = NUM_CLIENTS,
    seed: int = LEAF_SEED,
    alpha: float = LEAF_ALPHA,
    beta: float = LEAF_BETA,
    num_features: int = NUM_FEATURES,
    num_classes: int = NUM_CLASSES,
    misaligned_fraction: float = 0.0,
    misaligned_scale: float = MISALIGNED_SCALE,
) -> list[ClientArrays]:
  """Generates LEAF's Synthetic clients (see the module docstring).

  Args:
    num_clients: Number of clients.
    seed: Seed of the generator; LEAF's default, 931231, gives the data whose
      training split GeL's Table 4 describes.
    alpha: Standard deviation of each client's model scale around the shared
      one (model heterogeneity; LEAF: 0.1).
    beta: Standard deviation of each client's feature shift (data
      heterogeneity; LEAF: 1).
    num_features: Features per example (LEAF/GeL: 60).
    num_classes: Number of classes.
    misaligned_fraction: Fraction of clients made misaligned (module
      docstring), in [0, 0.5]; 0 gives LEAF's data.
    misaligned_scale: The misaligned clients' feature scale (> 0).

  Returns:
    One `(x, y)` per client: `x` float32 of shape [n_k, num_features], `y`
    int32 labels in [0, num_classes) of shape [n_k]; read-only arrays, which
    this process shares with every caller asking for the same data.

  Raises:
    ValueError: If a count is not positive or `alpha`/`beta` is negative.
  """
  for name, value in (('num_clients', num_clients),
                      ('num_features', num_features),
                      ('num_classes', num_classes)):
    if value < 1:
      raise ValueError(f'{name} must be positive, got {name}={value!r}')
  for name, value in (('alpha', alpha), ('beta', beta)):
    if value < 0:
      raise ValueError(f'{name} must be non-negative, got {name}={value!r}')
  misaligned_clients(num_clients, misaligned_fraction, seed)  # checks it
  if not 0.0 < misaligned_scale < np.inf:
    raise ValueError('misaligned_scale must be positive and finite, got'
                     f' {misaligned_scale!r}')
  return list(_generated_clients(num_clients, seed, alpha, beta, num_features,
                                 num_classes, misaligned_fraction,
                                 misaligned_scale))


# A process generates each dataset once: every run of a Synthetic task starts
# by generating LEAF's 1,000 clients in a Python loop, and the runs
# a sweep or the tests fork from one prestarted process
# (`experiment_driver.prestart`, which generates the default ones first)
# inherit its copy. The arrays are read-only, so no caller changes another's.
@functools.lru_cache(maxsize=4)
def _generated_clients(num_clients: int, seed: int, alpha: float, beta: float,
                       num_features: int, num_classes: int,
                       misaligned_fraction: float, misaligned_scale: float
                       ) -> tuple[ClientArrays, ...]:
  """`generate_synthetic_clients`' clients, its arguments checked."""
  misaligned = misaligned_clients(num_clients, misaligned_fraction, seed)
  sizes = _client_sizes(num_clients, seed)
  # LEAF's SyntheticDataset re-seeds NumPy before drawing the model.
  rng = np.random.RandomState(seed)
  shared_model = rng.normal(0.0, 1.0, (num_features + 1, num_classes, 1))
  covariance = np.diag(
      np.arange(1, num_features + 1, dtype=np.float64)
      ** _FEATURE_COVARIANCE_EXPONENT
  )
  # multivariate_normal's own arithmetic, its SVD once: the same draws.
  _, singular_values, v = np.linalg.svd(covariance)
  covariance_factor = np.sqrt(singular_values)[:, None] * v
  cluster_center = rng.normal(rng.normal(0.0, 1.0), 1.0, 1)
  clients = []
  for k, size in enumerate(sizes):
    rng.choice(1, p=[1.0])  # LEAF draws the client's (only) cluster.
    feature_shift = rng.normal(0.0, beta)
    feature_mean = rng.normal(feature_shift, 1.0, num_features)
    x = rng.standard_normal((size, num_features)) @ covariance_factor
    x += feature_mean
    model_scale = rng.normal(cluster_center, alpha, cluster_center.shape)
    weights = shared_model @ model_scale  # [num_features + 1, num_classes]
    x_with_bias_input = np.concatenate([np.ones((size, 1)), x], axis=1)
    scores = x_with_bias_input @ weights + rng.normal(
        0.0, _LABEL_NOISE_STDDEV, (size, num_classes)
    )
    if k in misaligned:
      clients.append(((misaligned_scale * x).astype(np.float32),
                      np.argmin(scores, axis=1).astype(np.int32)))
    else:
      clients.append(
          (x.astype(np.float32), np.argmax(scores, axis=1).astype(np.int32))
      )
  for arrays in clients:
    for array in arrays:
      array.flags.writeable = False
  return tuple(clients)


def misaligned_clients(num_clients: int, fraction: float,
                       seed: int = LEAF_SEED) -> frozenset[int]:
  """The indices of the misaligned clients: `round(fraction n)` of them
  (at least one when `fraction` > 0), drawn with a seed of their own so that
  the other clients' data stay LEAF's.

  Raises:
    ValueError: If `fraction` is not in [0, 0.5].
  """
  if not 0.0 <= fraction <= 0.5:
    raise ValueError('misaligned_fraction must be in [0, 0.5], got'
                     f' {fraction!r}')
  if fraction == 0.0:
    return frozenset()
  count = max(1, int(round(fraction * num_clients)))
  chosen = np.random.RandomState(seed + _MISALIGNED_SEED_OFFSET).choice(
      num_clients, count, replace=False)
  return frozenset(int(k) for k in chosen)


def split_client_examples(
    clients: list[ClientArrays], seed: int
) -> tuple[list[ClientArrays], list[ClientArrays]]:
  """LEAF's per-client split: a random `floor(0.9 n_k)` examples train.

  Args:
    clients: `(x, y)` per client, each with at least 2 examples.
    seed: Seed of the split.

  Returns:
    `(train, test)`: one `(x, y)` per client in each, examples in their
    original order.

  Raises:
    ValueError: If a client has fewer than 2 examples.
  """
  rng = np.random.RandomState(seed)
  train, test = [], []
  for x, y in clients:
    size = len(y)
    if size < 2:
      raise ValueError(f'a client needs 2 examples to split, got {size}')
    in_train = np.zeros(size, dtype=bool)
    in_train[rng.permutation(size)[:max(1, int(TRAIN_FRACTION * size))]] = True
    train.append((x[in_train], y[in_train]))
    test.append((x[~in_train], y[~in_train]))
  return train, test


def create_logistic_regression(
    num_features: int = NUM_FEATURES, num_classes: int = NUM_CLASSES
) -> tf.keras.Model:
  """A zero-initialized multinomial logistic regression (its logits)."""
  return tf.keras.Sequential([
      tf.keras.layers.InputLayer(input_shape=(num_features,)),
      tf.keras.layers.Dense(
          num_classes,
          kernel_initializer='zeros',
          bias_initializer='zeros',
      ),
  ])


def create_synthetic_task(
    train_batch_size: int = DEFAULT_TRAIN_BATCH_SIZE,
    eval_batch_size: int = DEFAULT_EVAL_BATCH_SIZE,
    num_epochs: int = 1,
    max_elements_per_client: Optional[int] = None,
    data_dir: Optional[str] = None,
    use_synthetic_data: bool = False,
    validation_fraction: float = 0.2,
    seed: int = 0,
    num_clients: int = NUM_CLIENTS,
    data_seed: int = LEAF_SEED,
    alpha: float = LEAF_ALPHA,
    beta: float = LEAF_BETA,
    num_classes: int = NUM_CLASSES,
    misaligned_fraction: float = 0.0,
    misaligned_scale: float = MISALIGNED_SCALE,
) -> tff.simulation.baselines.BaselineTask:
  """Creates GeL's Synthetic task: logistic regression on LEAF's Synthetic.

  Args:
    train_batch_size: Client batch size for training (GeL: 5).
    eval_batch_size: Batch size for evaluation.
    num_epochs: Local epochs per round (`E`).
    max_elements_per_client: If set, each client processes at most this many
      examples per round (after shuffling and repeating); `None`: all.
    data_dir: Unused: the data are generated in memory. Accepted so every
      task takes the same arguments.
    use_synthetic_data: Unused for the same reason (the data are synthetic).
    validation_fraction: Fraction of training clients held out as validation
      clients, in [0, 1).
    seed: Seed of the validation split.
    num_clients: Number of clients generated.
    data_seed: Seed of the generator and of the per-client train/test split;
      fixed by default so every run sees the same dataset (LEAF's seed, whose
      training split has GeL's 96,374 examples).
    alpha: Model heterogeneity (see `generate_synthetic_clients`).
    beta: Data heterogeneity (see `generate_synthetic_clients`).
    num_classes: Classes of the generator and the model (LEAF's 5).
    misaligned_fraction: Fraction of misaligned clients (module docstring).
    misaligned_scale: Their feature scale.

  Returns:
    A `tff.simulation.baselines.BaselineTask` whose clients' elements are
    `OrderedDict(x=float32 [60], y=int32)`; test data are the clients' own
    test examples.

  Raises:
    ValueError: If an argument is out of range.
  """
  del data_dir, use_synthetic_data  # The data are generated in memory.
  validation_split.check_validation_fraction(validation_fraction)
  train_client_spec, eval_client_spec = tff_tasks.client_specs(
      train_batch_size, eval_batch_size, num_epochs, max_elements_per_client
  )
  clients = generate_synthetic_clients(
      num_clients=num_clients, seed=data_seed, alpha=alpha, beta=beta,
      num_classes=num_classes, misaligned_fraction=misaligned_fraction,
      misaligned_scale=misaligned_scale,
  )
  train_clients, test_clients = split_client_examples(clients, data_seed)
  datasets = array_client_data.baseline_datasets(
      [collections.OrderedDict(x=x, y=y) for x, y in train_clients],
      [collections.OrderedDict(x=x, y=y) for x, y in test_clients],
      [f'{i:04d}' for i in range(num_clients)],
      validation_fraction=validation_fraction, seed=seed,
      train_client_spec=train_client_spec, eval_client_spec=eval_client_spec,
      largest_client=MAX_CLIENT_EXAMPLES)

  def model_fn() -> tff.learning.models.VariableModel:
    return tff.learning.models.from_keras_model(
        keras_model=create_logistic_regression(num_classes=num_classes),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        input_spec=datasets.element_type_structure,
        metrics=[tf.keras.metrics.SparseCategoricalAccuracy()],
    )

  return tff.simulation.baselines.BaselineTask(datasets, model_fn)
