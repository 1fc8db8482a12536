"""tasks.synthetic: LEAF's generator, GeL's statistics, a task that learns."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tasks import synthetic


def _leaf_reference(num_clients, seed, num_classes, num_dim=60):
  """LEAF's data/synthetic generator (main.py + data_generator.py), verbatim
  in its arithmetic, with a RandomState in place of the global NumPy seed and
  the softmax over classes of LEAF's current version."""
  rng = np.random.RandomState(seed)
  num_samples = [
      min(s + 5, 1000) for s in rng.lognormal(3, 2, num_clients).astype(int)
  ]
  rng = np.random.RandomState(seed)
  q = rng.normal(loc=0.0, scale=1.0, size=(num_dim + 1, num_classes, 1))
  sigma = np.zeros((num_dim, num_dim))
  for i in range(num_dim):
    sigma[i, i] = (i + 1) ** (-1.2)
  loc = rng.normal(loc=0, scale=1.0, size=None)
  means = [rng.normal(loc=loc, scale=1.0, size=1)]
  clients = []
  for n in num_samples:
    cluster = rng.choice(range(1), size=None, replace=True, p=[1.0])
    b = rng.normal(loc=0.0, scale=1.0, size=None)
    x_loc = rng.normal(loc=b, scale=1.0, size=num_dim)
    x = np.ones((n, num_dim + 1))
    x[:, 1:] = rng.multivariate_normal(mean=x_loc, cov=sigma, size=n)
    model_info = rng.normal(loc=means[cluster], scale=0.1, size=(1,))
    w = np.matmul(q, model_info)
    scores = np.matmul(x, w) + rng.normal(0.0, 0.1, size=(n, num_classes))
    prob = np.exp(scores) / np.exp(scores).sum(axis=1, keepdims=True)
    clients.append((x[:, 1:], np.argmax(prob, axis=1)))
  return clients


@pytest.fixture(scope='module')
def leaf_clients():
  return synthetic.generate_synthetic_clients()


@pytest.mark.parametrize('num_classes', [5, 10])
def test_generator_is_leafs(num_classes):
  ours = synthetic.generate_synthetic_clients(
      num_clients=40, seed=11, num_classes=num_classes
  )
  reference = _leaf_reference(40, seed=11, num_classes=num_classes)
  assert len(ours) == len(reference)
  for (x, y), (x_ref, y_ref) in zip(ours, reference):
    np.testing.assert_allclose(x, x_ref, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(y, y_ref)


def test_generator_is_deterministic_by_seed():
  first = synthetic.generate_synthetic_clients(num_clients=20, seed=1)
  # Generated anew, past the process's cache.
  again = synthetic._generated_clients.__wrapped__(
      20, 1, synthetic.LEAF_ALPHA, synthetic.LEAF_BETA, synthetic.NUM_FEATURES,
      synthetic.NUM_CLASSES, 0.0, synthetic.MISALIGNED_SCALE)
  other = synthetic.generate_synthetic_clients(num_clients=20, seed=2)
  for (x, y), (x_again, y_again) in zip(first, again):
    np.testing.assert_array_equal(x, x_again)
    np.testing.assert_array_equal(y, y_again)
  assert any(
      len(y) != len(y_other) or not np.array_equal(x, x_other)
      for (x, y), (x_other, y_other) in zip(first, other)
  )


def test_default_data_have_gels_statistics(leaf_clients):
  # GeL, Table 4: 1,000 clients, 96,374 samples, median 22 per client. They
  # are the training split (floor(0.9 n_k) per client) of LEAF's default seed;
  # with the same generator and seed the counts must match exactly.
  sizes = np.array([len(y) for _, y in leaf_clients])
  assert len(leaf_clients) == 1000
  assert sizes.min() >= synthetic.MIN_CLIENT_EXAMPLES
  assert sizes.max() <= synthetic.MAX_CLIENT_EXAMPLES
  assert sizes.sum() == 107_553  # LEAF's paper: 107,553 samples in all.
  train, test = synthetic.split_client_examples(leaf_clients, seed=0)
  train_sizes = np.array([len(y) for _, y in train])
  assert train_sizes.sum() == 96_374
  assert np.median(train_sizes) == 22.5
  assert sum(len(y) for _, y in test) == 107_553 - 96_374
  x, y = leaf_clients[0]
  assert x.shape[1] == 60 and x.dtype == np.float32 and y.dtype == np.int32
  labels = np.concatenate([y for _, y in leaf_clients])
  assert set(np.unique(labels)) == set(range(synthetic.NUM_CLASSES))


def test_sizes_of_other_seeds_are_near_gels():
  # Over seeds, LEAF's log-normal(3, 2) sizes + 5 (capped at 1,000) give a
  # total of 101k +- 6k examples (Monte Carlo over 2,000 seeds) and a median
  # of 25 +- 2; four standard deviations bound every seed below.
  for seed in range(3):
    # pylint: disable-next=protected-access
    sizes = synthetic._client_sizes(1000, seed)
    assert abs(sizes.sum() - 101_000) < 4 * 6_100
    assert abs(np.median(sizes) - 25) < 4 * 1.7


def test_beta_spreads_client_features_and_alpha_only_labels():
  def client_feature_means(clients):
    return np.array([x.mean() for x, _ in clients])

  # A client's mean feature is B_k + mean(N(0, 1) over 60 features) + noise,
  # so its spread over clients is about sqrt(beta^2 + 1/60).
  homogeneous = synthetic.generate_synthetic_clients(
      num_clients=400, seed=5, beta=0.0
  )
  heterogeneous = synthetic.generate_synthetic_clients(
      num_clients=400, seed=5, beta=2.0
  )
  assert client_feature_means(homogeneous).std() < 0.4
  assert 1.6 < client_feature_means(heterogeneous).std() < 2.4
  # alpha moves each client's model, not its features.
  same_models = synthetic.generate_synthetic_clients(
      num_clients=50, seed=5, alpha=0.0
  )
  spread_models = synthetic.generate_synthetic_clients(
      num_clients=50, seed=5, alpha=3.0
  )
  for (x, _), (x_spread, _) in zip(same_models, spread_models):
    np.testing.assert_array_equal(x, x_spread)
  assert any(
      not np.array_equal(y, y_spread)
      for (_, y), (_, y_spread) in zip(same_models, spread_models)
  )


def test_misaligned_clients_flip_their_labels_and_scale_their_features():
  leaf = _leaf_reference(200, seed=11, num_classes=5)
  ours = synthetic.generate_synthetic_clients(
      num_clients=200, seed=11, misaligned_fraction=0.02,
      misaligned_scale=30.0)
  chosen = synthetic.misaligned_clients(200, 0.02, seed=11)
  assert len(chosen) == 4
  for k, ((x, y), (x_ref, y_ref)) in enumerate(zip(ours, leaf)):
    if k not in chosen:  # LEAF's data, draw for draw
      np.testing.assert_allclose(x, x_ref, rtol=1e-6, atol=1e-6)
      np.testing.assert_array_equal(y, y_ref)
      continue
    np.testing.assert_allclose(x, 30.0 * x_ref, rtol=1e-5, atol=1e-5)
    # The label its own model ranks last: never the one it ranks first.
    assert not np.any(y == y_ref)
  # A fixed set: the same at every call, one client at least.
  assert synthetic.misaligned_clients(200, 0.02, seed=11) == chosen
  assert len(synthetic.misaligned_clients(200, 0.001, seed=11)) == 1
  assert synthetic.misaligned_clients(200, 0.0) == frozenset()


def test_a_process_generates_each_dataset_once_and_read_only():
  first = synthetic.generate_synthetic_clients(num_clients=20, seed=5)
  again = synthetic.generate_synthetic_clients(num_clients=20, seed=5)
  assert first is not again  # each caller its own list
  assert all(x is x_again and y is y_again
             for (x, y), (x_again, y_again) in zip(first, again))
  other = synthetic.generate_synthetic_clients(num_clients=20, seed=5,
                                               num_classes=3)
  assert first[0][0] is not other[0][0]
  assert max(y.max() for _, y in other) <= 2
  x, y = first[0]
  for array in (x, y):
    with pytest.raises(ValueError, match='read-only'):
      array[0] = 0


@pytest.mark.parametrize(
    'kwargs', [{'num_clients': 0}, {'alpha': -1.0}, {'beta': -0.5},
               {'misaligned_fraction': 0.6}, {'misaligned_fraction': -0.1},
               {'misaligned_fraction': 0.1, 'misaligned_scale': 0.0}]
)
def test_bad_generator_arguments_are_value_errors(kwargs):
  name = list(kwargs)[-1]
  with pytest.raises(ValueError, match=name):
    synthetic.generate_synthetic_clients(**kwargs)


def test_split_partitions_each_clients_examples():
  clients = synthetic.generate_synthetic_clients(num_clients=30, seed=3)
  train, test = synthetic.split_client_examples(clients, seed=4)
  for (x, y), (x_train, y_train), (x_test, y_test) in zip(clients, train, test):
    assert len(y_train) == int(0.9 * len(y))
    rows = {tuple(row) for row in x}
    train_rows = {tuple(row) for row in x_train}
    test_rows = {tuple(row) for row in x_test}
    assert not train_rows & test_rows
    assert train_rows | test_rows == rows
    assert len(y_train) + len(y_test) == len(y)


def test_task_splits_validation_clients_reproducibly():
  task = synthetic.create_synthetic_task(num_clients=50, seed=2)
  again = synthetic.create_synthetic_task(num_clients=50, seed=2)
  train_ids = task.datasets.train_data.client_ids
  validation_ids = task.datasets.validation_data.client_ids
  assert len(train_ids) == 40 and len(validation_ids) == 10
  assert not set(train_ids) & set(validation_ids)
  assert again.datasets.validation_data.client_ids == validation_ids
  assert len(task.datasets.test_data.client_ids) == 50
  spec = task.datasets.element_type_structure
  assert spec['x'].shape.as_list() == [None, 60]


def test_client_data_serves_each_clients_examples_in_both_paths():
  clients = synthetic.generate_synthetic_clients(num_clients=12, seed=6)
  task = synthetic.create_synthetic_task(num_clients=12, data_seed=6, seed=0)
  train_clients, _ = synthetic.split_client_examples(clients, seed=6)
  train_data = task.datasets.train_data
  dataset_fn = tf.function(train_data.serializable_dataset_fn)
  for client_id in train_data.client_ids:
    x, y = train_clients[int(client_id)]
    for dataset in (train_data.create_tf_dataset_for_client(client_id),
                    dataset_fn(tf.constant(client_id))):
      batch = next(iter(dataset.batch(10_000)))
      np.testing.assert_array_equal(batch['x'], x)
      np.testing.assert_array_equal(batch['y'], y)
  everything = next(iter(train_data.create_tf_dataset_from_all_clients()
                         .batch(100_000)))
  assert len(everything['y']) == sum(
      len(train_clients[int(c)][1]) for c in train_data.client_ids)
  validation_id = task.datasets.validation_data.client_ids[0]
  with pytest.raises(ValueError, match=validation_id):
    train_data.create_tf_dataset_for_client(validation_id)


def _fed_avg(task, client_learning_rate):
  return tff.learning.algorithms.build_weighted_fed_avg(
      task.model_fn,
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(
          client_learning_rate
      ),
      server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0),
  )


def _client_datasets(task, client_ids):
  return [
      task.datasets.train_preprocess_fn(
          task.datasets.train_data.create_tf_dataset_for_client(client_id)
      )
      for client_id in client_ids
  ]


def test_one_fedavg_step_matches_numpy_softmax_regression():
  # One client, one full batch: FedAvg with server SGD lr 1 moves the model
  # to the client's model after one gradient step of mean cross-entropy.
  task = synthetic.create_synthetic_task(
      num_clients=3, train_batch_size=1000, validation_fraction=0.0
  )
  client_dataset = _client_datasets(
      task, task.datasets.train_data.client_ids[:1]
  )
  batch = next(iter(client_dataset[0]))
  x, y = batch['x'].numpy().astype(np.float64), batch['y'].numpy()
  learning_rate = 0.5
  process = _fed_avg(task, learning_rate)
  output = process.next(process.initialize(), client_dataset)
  kernel, bias = process.get_model_weights(output.state).trainable
  # Zero initial model: uniform predictions, loss ln(C).
  c = synthetic.NUM_CLASSES
  residual = np.full((len(y), c), 1.0 / c) - np.eye(c)[y]
  np.testing.assert_allclose(
      kernel, -learning_rate * x.T @ residual / len(y), rtol=1e-4, atol=1e-6
  )
  np.testing.assert_allclose(
      bias, -learning_rate * residual.mean(axis=0), rtol=1e-4, atol=1e-6
  )
  train_metrics = output.metrics['client_work']['train']
  assert train_metrics['loss'] == pytest.approx(np.log(c), rel=1e-5)
  assert train_metrics['num_examples'] == len(y)
  assert synthetic.ACCURACY_METRIC_NAME in train_metrics


def test_a_misaligned_client_sends_its_gradient_where_the_model_rules_it_out():
  # The mechanism of `misaligned_fraction`: at a server model sure of one
  # class, a client whose labels are the others must send its (large)
  # gradient. A softmax output with Keras' clipped cross-entropy sent exactly
  # zero here (the probabilities of its labels are below 1e-7).
  task = synthetic.create_synthetic_task(
      num_clients=200, train_batch_size=1000, validation_fraction=0.0,
      misaligned_fraction=0.02, misaligned_scale=100.0)
  client_id = f'{min(synthetic.misaligned_clients(200, 0.02)):04d}'
  client_dataset = _client_datasets(task, [client_id])
  batch = next(iter(client_dataset[0]))
  x, y = batch['x'].numpy().astype(np.float64), batch['y'].numpy()
  c = synthetic.NUM_CLASSES
  certain = next(k for k in range(c) if not np.any(y == k))
  learning_rate = 0.1
  process = _fed_avg(task, learning_rate)
  state = process.initialize()
  bias = np.zeros(c, np.float32)
  bias[certain] = 50.0  # p(label) ~ e^-50 for every example
  state = process.set_model_weights(state, tff.learning.models.ModelWeights(
      trainable=[np.zeros((synthetic.NUM_FEATURES, c), np.float32), bias],
      non_trainable=[]))
  output = process.next(state, client_dataset)
  kernel, new_bias = process.get_model_weights(output.state).trainable
  logits = np.zeros((len(y), c))
  logits[:, certain] = 50.0
  p = np.exp(logits - logits.max(axis=1, keepdims=True))
  residual = p / p.sum(axis=1, keepdims=True) - np.eye(c)[y]
  expected = -learning_rate * x.T @ residual / len(y)
  np.testing.assert_allclose(kernel, expected, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(new_bias - bias,
                             -learning_rate * residual.mean(axis=0),
                             rtol=1e-4, atol=1e-5)
  assert np.linalg.norm(kernel) > 10.0


def test_fedavg_trains_two_rounds_on_two_clients_with_max_elements():
  task = synthetic.create_synthetic_task(
      num_clients=10, max_elements_per_client=4, validation_fraction=0.0
  )
  process = _fed_avg(task, synthetic.CLIENT_LEARNING_RATE)
  state = process.initialize()
  client_ids = task.datasets.train_data.client_ids[:2]
  for _ in range(2):
    output = process.next(state, _client_datasets(task, client_ids))
    state = output.state
    assert output.metrics['client_work']['train']['num_examples'] == 2 * 4
  assert np.isfinite(output.metrics['client_work']['train']['loss'])


def test_fedavg_with_the_default_client_rate_learns():
  # The embedded default task must learn: 20 FedAvg rounds of 10 clients lift
  # test accuracy well above always predicting the majority class.
  task = synthetic.create_synthetic_task()
  test_x, test_y = [], []
  for batch in task.datasets.get_centralized_test_data():
    test_x.append(batch['x'].numpy())
    test_y.append(batch['y'].numpy())
  test_x, test_y = np.concatenate(test_x), np.concatenate(test_y)
  majority_accuracy = np.bincount(test_y).max() / len(test_y)
  process = _fed_avg(task, synthetic.CLIENT_LEARNING_RATE)
  state = process.initialize()
  rng = np.random.RandomState(0)
  for _ in range(20):
    client_ids = rng.choice(
        task.datasets.train_data.client_ids, 10, replace=False
    )
    state = process.next(state, _client_datasets(task, client_ids)).state
  kernel, bias = process.get_model_weights(state).trainable
  accuracy = np.mean((test_x @ kernel + bias).argmax(axis=1) == test_y)
  assert accuracy > majority_accuracy + 0.1


def test_the_default_is_gels_table_1_model_of_305_parameters():
  task = synthetic.create_synthetic_task(num_clients=20)
  model = task.model_fn()
  assert sum(int(np.prod(v.shape)) for v in model.trainable_variables) == 305
  ten = synthetic.create_synthetic_task(num_clients=20, num_classes=10)
  assert sum(int(np.prod(v.shape))
             for v in ten.model_fn().trainable_variables) == 610
  labels = [int(e['y']) for e in
            ten.datasets.train_data.create_tf_dataset_from_all_clients()]
  assert max(labels) == 9
