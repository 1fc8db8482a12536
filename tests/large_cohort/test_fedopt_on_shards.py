"""`build_fedopt` on shards (`fl_engine.compose`): a round on shards of clients equals the per-client
round (`build_fedopt` with the diagnosed mean) on the same clients: model,
clipping norm, server optimizer state, the paper's diagnostics and the
training metrics, with uneven client sizes, an empty client, a NaN client
and shards of uneven length."""

import collections
import functools

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fl_common import diagnosed_mean
from fl_engine import fused as fl_fused
from fl_engine import shards
from large_cohort import fedopt
from fl_common import normalized_update
from tests import fused_checks
from tests import tiny_models

_NUM_FEATURES = fused_checks.NUM_FEATURES


def _processes(weighting, clipping, server_optimizer):
  model_fn = tiny_models.linear_model_fn(_NUM_FEATURES)
  kwargs = dict(
      client_optimizer=tff.learning.optimizers.build_sgdm(0.1, momentum=0.5),
      server_optimizer=server_optimizer,
      client_weighting=weighting,
      model_aggregator=diagnosed_mean.diagnosed_mean_factory(
          clipping=clipping,
          weighted=weighting is tff.learning.ClientWeighting.NUM_EXAMPLES,
          initial_clipping_norm=0.05))
  return fedopt.build_fedopt(model_fn, **kwargs), fused_checks.on_shards(fedopt.build_fedopt, 
      model_fn, **kwargs)


@functools.cache
def _processes_for(weighting, clipping, server):
  """`_processes` with a named server optimizer, built once for every
  `clients_per_shard` it is tried with (how shards are cut is an argument
  of the round, not of the process)."""
  server_optimizer = {
      'adam': tff.learning.optimizers.build_adam(
          0.05, epsilon=fused_checks.ADAM_EPSILON),
      'sgd': tff.learning.optimizers.build_sgdm(1.0),
      'sgdm': tff.learning.optimizers.build_sgdm(0.5, momentum=0.9),
  }[server]
  return _processes(weighting, clipping, server_optimizer)


@pytest.mark.parametrize('weighting, clipping, server', [
    (tff.learning.ClientWeighting.NUM_EXAMPLES, True, 'adam'),
    (tff.learning.ClientWeighting.NUM_EXAMPLES, False, 'sgd'),
    (tff.learning.ClientWeighting.UNIFORM, True, 'sgdm'),
])
@pytest.mark.parametrize('clients_per_shard', [1, 3, 4, 7])
def test_a_fused_round_equals_the_per_client_round(weighting, clipping, server,
                                                   clients_per_shard):
  per_client, on_shards = _processes_for(weighting, clipping, server)
  # Uneven sizes (odd ones end in a short batch), an empty client, a NaN one.
  sizes = [5, 1, 0, 8, 3, 4, 2]
  datasets = fused_checks.client_datasets(sizes, nan_client=4)
  # The same state: checkpoints and weights carry over between the two.
  assert (on_shards.initialize.type_signature ==
          per_client.initialize.type_signature)
  assert (on_shards.get_model_weights.type_signature ==
          per_client.get_model_weights.type_signature)
  # One initial state for both (each initialize() draws Keras' initializers).
  state = fused_state = per_client.initialize()
  for _ in range(2):  # two rounds: the clipping norm and the moments move
    output, fused_output = fused_checks.assert_same_round(
        per_client, on_shards, state, fused_state, datasets, clients_per_shard)
    state, fused_state = output.state, fused_output.state
  fused_checks.assert_screened(fused_output.metrics, sizes, nan_client=4)


@pytest.mark.parametrize('clipping, lanes', [(True, 1), (False, 1),
                                            (True, 3)])
def test_a_fused_fedsgd_round_equals_the_per_client_round(clipping, lanes):
  model_fn = tiny_models.linear_model_fn(_NUM_FEATURES)
  kwargs = dict(
      server_optimizer=tff.learning.optimizers.build_sgdm(0.5, momentum=0.9),
      model_aggregator=diagnosed_mean.diagnosed_mean_factory(
          clipping=clipping, initial_clipping_norm=0.3))
  per_client = fedopt.build_fedsgd(model_fn, **kwargs)
  on_shards = fused_checks.on_shards(fedopt.build_fedsgd, model_fn, lanes=lanes, **kwargs)
  assert (on_shards.initialize.type_signature ==
          per_client.initialize.type_signature)
  sizes = [5, 1, 0, 8, 3, 4, 2]
  datasets = fused_checks.client_datasets(sizes, nan_client=4)
  state = fused_state = per_client.initialize()
  for clients_per_shard in (3, 7):
    output, fused_output = fused_checks.assert_same_round(
        per_client, on_shards, state, fused_state, datasets, clients_per_shard)
    state, fused_state = output.state, fused_output.state
  # FedSGD (as TFF's) keeps a NaN client's metrics: every example counts.
  assert fused_output.metrics['client_work']['train']['num_examples'] == sum(
      sizes)
  assert fused_output.metrics['aggregator']['num_zero_updates'] == 2


@pytest.mark.parametrize('weighting', [
    tff.learning.ClientWeighting.NUM_EXAMPLES,
    tff.learning.ClientWeighting.UNIFORM])
def test_a_fused_round_with_the_normalized_update(weighting):
  model_fn = tiny_models.linear_model_fn(_NUM_FEATURES)
  kwargs = dict(
      client_optimizer=tff.learning.optimizers.build_sgdm(0.1),
      server_optimizer=tff.learning.optimizers.build_sgdm(0.3),
      client_weighting=weighting,
      model_aggregator=normalized_update.normalized_update_factory(
          diagnosed_mean.diagnosed_mean_factory(
              clipping=True, initial_clipping_norm=0.05,
              weighted=weighting is tff.learning.ClientWeighting.NUM_EXAMPLES)))
  per_client = fedopt.build_fedopt(model_fn, **kwargs)
  on_shards = fused_checks.on_shards(fedopt.build_fedopt, model_fn, **kwargs)
  datasets = fused_checks.client_datasets([5, 1, 0, 8, 3], nan_client=3)
  state = per_client.initialize()
  output, fused_output = fused_checks.assert_same_round(
      per_client, on_shards, state, state, datasets, 2)
  # Server SGD at 0.3 along the unit-norm update: a step of length 0.3.
  moved = (tiny_models.flat(
      per_client.get_model_weights(output.state).trainable) -
           tiny_models.flat(per_client.get_model_weights(state).trainable))
  np.testing.assert_allclose(np.linalg.norm(moved), 0.3, rtol=1e-5)


def test_a_round_on_shards_cut_to_a_byte_cap_equals_the_per_client_round():
  per_client, on_shards = _processes(
      tff.learning.ClientWeighting.NUM_EXAMPLES, True,
      tff.learning.optimizers.build_sgdm(1.0))
  # 16 bytes per example: one shard of 7 clients cut at 100 bytes into
  # [5, 1, 0], [8] (alone, over the cap), [3], [4, 2].
  datasets = fused_checks.client_datasets([5, 1, 0, 8, 3, 4, 2], nan_client=4)
  state = per_client.initialize()
  fused_checks.assert_same_round(per_client, on_shards, state, state,
                                 datasets, 7, max_shard_bytes=100)


@pytest.mark.parametrize('lanes', [1, 2])
def test_a_saturated_softmax_classifier_trains_as_on_the_per_client_round(
    lanes):
  # Inlined, Keras would see the softmax's logits and compute the loss (and
  # its gradient) from them; TFF's per-client forward pass clips the
  # probabilities instead (`fl_engine.fused.with_called_predictions`).
  model_fn = fused_checks.saturated_classifier_fn()
  kwargs = dict(
      client_optimizer=tff.learning.optimizers.build_sgdm(0.1),
      server_optimizer=tff.learning.optimizers.build_sgdm(1.0),
      model_aggregator=diagnosed_mean.diagnosed_mean_factory(clipping=False))
  per_client = fedopt.build_fedopt(model_fn, **kwargs)
  on_shards = fused_checks.on_shards(fedopt.build_fedopt, model_fn, lanes=lanes, **kwargs)
  datasets = fused_checks.saturated_classifier_datasets([5, 3, 8, 2])
  state = per_client.initialize()
  output, _ = fused_checks.assert_same_round(per_client, on_shards, state,
                                             state, datasets, 2)
  fused_checks.assert_saturated_loss(
      output.metrics['client_work']['train']['loss'])


def test_split_shards_cut_at_client_boundaries_within_the_cap():
  sizes = [5, 1, 0, 8, 3, 4, 2]
  datasets = fused_checks.client_datasets(sizes)
  [whole] = shards.shards_from_datasets(datasets, len(sizes))
  pieces = shards.split_shards([whole], 100)
  clients = [shards.num_clients(p) for p in pieces]
  assert clients == [3, 1, 1, 2]
  for piece, n in zip(pieces, clients):
    example_bytes = sum(a.nbytes for a in piece['examples'].values())
    assert example_bytes <= 100 or n == 1
    assert piece['batch_sizes'][-1] == 0  # closed by its last client's batch
    assert len(piece['examples']['x']) == piece['batch_sizes'].sum()
  for key in ('x', 'y'):
    np.testing.assert_array_equal(
        np.concatenate([p['examples'][key] for p in pieces]),
        whole['examples'][key])
  np.testing.assert_array_equal(
      np.concatenate([p['batch_sizes'] for p in pieces]),
      whole['batch_sizes'])
  # Within the cap, or empty: as it was.
  assert shards.split_shards([whole], 10**6)[0] is whole
  with pytest.raises(ValueError, match='max_bytes'):
    shards.split_shards([whole], 0)


def test_shards_close_every_client_and_split_unevenly():
  datasets = fused_checks.client_datasets([3, 0, 2])
  made = shards.shards_from_datasets(datasets, 2)
  assert [list(s['batch_sizes']) for s in made] == [[2, 1, 0, 0], [2, 0]]
  examples = np.concatenate([s['examples']['x'] for s in made])
  expected = np.concatenate([np.concatenate([b['x'] for b in d])
                             for d in datasets if d.cardinality() > 0])
  np.testing.assert_array_equal(examples, expected)


def test_shards_from_client_data_read_each_clients_pipeline():
  datasets = fused_checks.client_datasets([3, 4, 1])
  client_data = tff.simulation.datasets.TestClientData({
      str(k): tf.nest.map_structure(
          lambda t: t.numpy(), next(iter(d.unbatch().batch(100))))
      for k, d in enumerate(datasets)})
  made = shards.shards_from_client_data(
      client_data, lambda d: d.batch(2), ['2', '0', '1'], 2)
  assert [list(s['batch_sizes']) for s in made] == [[1, 0, 2, 1, 0],
                                                     [2, 2, 0]]
  per_client = shards.shards_from_datasets(
      [d.unbatch().batch(2) for d in (datasets[2], datasets[0],
                                      datasets[1])], 2)
  for a, b in zip(made, per_client):
    tf.nest.map_structure(np.testing.assert_array_equal, a, b)
  # Cut to step budgets (cycling): as the per-client pipelines, and as
  # shards_for_round makes them for a TestClientData.
  budgeted = shards.shards_from_client_data(
      client_data, lambda d: d.batch(2), ['2', '0', '1'], 2, steps=[3, 1, 4])
  assert [list(s['batch_sizes']) for s in budgeted] == [[1, 1, 1, 0, 2, 0],
                                                         [2, 2, 2, 2, 0]]
  for a, b in zip(budgeted, shards.shards_for_round(
      client_data, lambda d: d.batch(2), ['2', '0', '1'], 2,
      np.random.default_rng(0), steps=[3, 1, 4])):
    tf.nest.map_structure(np.testing.assert_array_equal, a, b)


def test_shards_from_arrays_batch_each_clients_rows():
  examples = collections.OrderedDict(x=np.arange(10.0)[:, None],
                                     y=np.arange(10))
  rows = [np.arange(0, 5), np.arange(5, 5), np.arange(5, 10)]
  recipe = shards.BatchRecipe(batch_size=2, num_epochs=2, max_elements=7)
  made = shards.shards_from_arrays(examples, rows, recipe, 2,
                                   np.random.default_rng(0))
  # 7 of 10 (two passes of 5), then nothing, then 7 of the third client's.
  assert [list(s['batch_sizes']) for s in made] == [[2, 2, 2, 1, 0, 0],
                                                    [2, 2, 2, 1, 0]]
  first = made[0]['examples']['y']
  # Each pass is a permutation of the client's own rows.
  assert sorted(first[:5]) == [0, 1, 2, 3, 4] and set(first[5:]) <= set(
      range(5))
  assert sorted(made[1]['examples']['y'][:5]) == [5, 6, 7, 8, 9]
  np.testing.assert_array_equal(made[0]['examples']['x'][:, 0], first)


def test_refuses_an_aggregator_it_cannot_fuse():
  with pytest.raises(TypeError, match='WeightedDiagnosedMeanFactory'):
    fused_checks.on_shards(fedopt.build_fedopt, 
        tiny_models.linear_model_fn(_NUM_FEATURES),
        client_optimizer=tff.learning.optimizers.build_sgdm(0.1),
        server_optimizer=tff.learning.optimizers.build_sgdm(1.0),
        model_aggregator=tff.aggregators.MeanFactory())


def test_shards_from_arrays_cut_each_client_to_its_step_budget():
  examples = collections.OrderedDict(x=np.arange(10.0)[:, None],
                                     y=np.arange(10))
  rows = [np.arange(0, 5), np.arange(5, 5), np.arange(5, 8)]
  recipe = shards.BatchRecipe(batch_size=2)
  made = shards.shards_from_arrays(examples, rows, recipe, 3,
                                   np.random.default_rng(0), steps=[7, 4, 2])
  # Passes of [2, 2, 1] batches, repeated and cut at 7; none for the empty
  # client; 2 of the third client's [2, 1].
  assert list(made[0]['batch_sizes']) == [2, 2, 1, 2, 2, 1, 2, 0, 0, 2, 1, 0]
  y = made[0]['examples']['y']
  assert len(y) == 12 + 3
  # Each pass is a permutation of the client's rows.
  assert sorted(y[:5]) == sorted(y[5:10]) == [0, 1, 2, 3, 4]
  assert set(y[10:12]) <= set(range(5))
  assert sorted(y[12:]) == [5, 6, 7]
  with pytest.raises(ValueError, match='step counts'):
    shards.shards_from_arrays(examples, rows, recipe, 3,
                              np.random.default_rng(0), steps=[1])


def _loop_call_ops(graph_def):
  """The function-call ops in the bodies of a graph's loops."""
  return [node.op for function in graph_def.library.function
          if 'while_body' in function.signature.name
          for node in function.node_def
          if node.op in ('PartitionedCall', 'StatefulPartitionedCall')]


def test_inner_tf_functions_are_traced_in_place():
  inner = tf.function(lambda x: x * 2.0 + 1.0)

  def body(x):
    return tf.while_loop(lambda i, y: i < 3, lambda i, y: (i + 1, inner(y)),
                         (0, x))[1]

  def graph_def(fn):
    return tf.function(fn).get_concrete_function(
        tf.TensorSpec([], tf.float32)).graph.as_graph_def()

  assert fl_fused.trace_inlined(body, tf.constant(1.0)).numpy() == 15.0
  assert not _loop_call_ops(graph_def(
      lambda x: fl_fused.trace_inlined(body, x)))
  assert _loop_call_ops(graph_def(body))  # what it avoids
  assert not tf.config.functions_run_eagerly()  # restored


class _BranchingLoss(tf.keras.losses.Loss):
  """Mean squared error, in Python that branches on a tensor: it needs
  AutoGraph."""

  def call(self, y_true, y_pred):
    loss = tf.reduce_mean(tf.square(y_true - y_pred), axis=-1)
    if tf.reduce_sum(tf.abs(y_pred)) > 1e9:
      loss = loss * 0.0
    return loss


def test_a_model_that_needs_autograph_runs_on_shards_uninlined():
  def model_fn():
    return tff.learning.models.from_keras_model(
        tf.keras.Sequential([tf.keras.layers.Dense(
            1, input_shape=(_NUM_FEATURES,))]),
        loss=_BranchingLoss(),
        input_spec=collections.OrderedDict(
            x=tf.TensorSpec([None, _NUM_FEATURES], tf.float32),
            y=tf.TensorSpec([None, 1], tf.float32)))

  model = model_fn()

  def forward_inlined(batch):
    with fl_fused.inlined_tf_functions():
      return model.forward_pass(batch).loss

  # Traced in place, the loss is not converted by AutoGraph and fails ...
  with pytest.raises(tf.errors.OperatorNotAllowedInGraphError):
    tf.function(forward_inlined, autograph=False).get_concrete_function(
        fl_fused.batched_spec(model.input_spec))
  # ... so the shards trace the model as calls, and the round is the same.
  _assert_a_sgd_round_on_shards_is_per_clients(
      model_fn, fused_checks.client_datasets([4, 3, 5]))


def _assert_a_sgd_round_on_shards_is_per_clients(model_fn, datasets):
  kwargs = dict(
      client_optimizer=tff.learning.optimizers.build_sgdm(0.1),
      server_optimizer=tff.learning.optimizers.build_sgdm(1.0),
      model_aggregator=diagnosed_mean.diagnosed_mean_factory(clipping=False))
  per_client = fedopt.build_fedopt(model_fn, **kwargs)
  on_shards = fused_checks.on_shards(fedopt.build_fedopt, model_fn, **kwargs)
  state = per_client.initialize()
  fused_checks.assert_same_round(per_client, on_shards, state, state,
                                 datasets, 2)


def test_a_model_that_runs_its_own_loop_runs_on_shards_as_calls():
  # A recurrent model's forward pass is called, not inlined, by the shards
  # (`runs_own_loops`: inlined, the LSTM's rounds were slower); same round.
  def rnn_model_fn():
    return tff.learning.models.from_keras_model(
        tf.keras.Sequential([
            tf.keras.layers.Reshape((_NUM_FEATURES, 1),
                                    input_shape=(_NUM_FEATURES,)),
            tf.keras.layers.SimpleRNN(2),
            tf.keras.layers.Dense(1)]),
        loss=tf.keras.losses.MeanSquaredError(),
        input_spec=collections.OrderedDict(
            x=tf.TensorSpec([None, _NUM_FEATURES], tf.float32),
            y=tf.TensorSpec([None, 1], tf.float32)))

  assert fl_fused.runs_own_loops(rnn_model_fn)
  assert not fl_fused.runs_own_loops(tiny_models.linear_model_fn(
      _NUM_FEATURES))
  _assert_a_sgd_round_on_shards_is_per_clients(
      rnn_model_fn, fused_checks.client_datasets([4, 0, 5, 3], nan_client=2))
