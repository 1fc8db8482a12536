"""Resident examples (`fl_engine.resident.ResidentExamples`): a fused process
that holds the population's examples on the worker (files it memory-maps)
and takes shards of their rows computes the same round as one that takes
shards of the examples, drawn with the same generator, for every fused
builder and for the fused evaluation: uneven client sizes, an empty client,
a NaN client, step budgets, shards of uneven length, and the driver's
element-wise transform (applied once to the held arrays, or to each round's
gathered examples)."""

import collections
import gc
import os

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff
import tree
from absl import flags

from adabest_tff import adabest
from adabest_tff import feddyn
from fl_engine import stateful_runner as runner_lib
from adabest_tff import scaffold
from experiment_driver import adabest_setup
from experiment_driver import algorithm_setup
from experiment_driver import fedopt_setup
from experiment_driver import gel_setup
from fl_common import diagnosed_mean
from fl_engine import execution
from fl_engine import per_client_evaluation
from fl_engine import resident
from fl_engine import scratch
from fl_engine import shards
from gel_tff import gel
from large_cohort import fedopt
from tasks import synthetic
from tests import fused_checks
from tests import tiny_models

_SIZES = [5, 1, 0, 8, 3, 4, 2]


@pytest.fixture(autouse=True, scope='module')
def parsed_flags():  # The driver's setups read their families' flags.
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()
_NAN_CLIENT = 4
_RECIPE = shards.BatchRecipe(
    batch_size=2, num_epochs=2, fill_last_batch=True,
    # As `tasks.partitioned_task`'s: element-wise, in NumPy.
    transform=lambda e: collections.OrderedDict(x=e['x'] * 0.5, y=e['y']))


def _population(seed=0):
  """The clients as rows of shared arrays (client k: rows `client_rows[k]`,
  shuffled so that rows are not in client order)."""
  rng = np.random.default_rng(seed)
  total = sum(_SIZES)
  x = rng.normal(size=(total, fused_checks.NUM_FEATURES)).astype(np.float32)
  y = rng.normal(size=(total, 1)).astype(np.float32)
  order = rng.permutation(total)
  client_rows = np.split(order, np.cumsum(_SIZES)[:-1])
  x[client_rows[_NAN_CLIENT][0], 0] = np.nan
  return collections.OrderedDict(x=x, y=y), client_rows


def _both_shards(arrays, client_rows, clients_per_shard, seed, steps=None):
  kwargs = dict(recipe=_RECIPE, clients_per_shard=clients_per_shard,
                steps=steps)
  sent = shards.shards_from_arrays(arrays, client_rows,
                                   rng=np.random.default_rng(seed), **kwargs)
  rows = shards.shards_from_arrays(arrays, client_rows,
                                   rng=np.random.default_rng(seed),
                                   rows_only=True, **kwargs)
  return sent, rows


def _resident(arrays):
  return _RECIPE.transform(arrays)


def test_rows_gather_to_the_examples_a_shard_carries():
  arrays, client_rows = _population()
  sent, rows = _both_shards(arrays, client_rows, 3, seed=5, steps=None)
  resident = _resident(arrays)
  assert [sorted(s) for s in rows] == [['batch_sizes', 'rows']] * len(rows)
  for a, b in zip(sent, rows):
    np.testing.assert_array_equal(a['batch_sizes'], b['batch_sizes'])
    for name in ('x', 'y'):
      np.testing.assert_array_equal(a['examples'][name],
                                    resident[name][b['rows']])


_FEDOPT_KW = dict(
    client_optimizer=tff.learning.optimizers.build_sgdm(0.1, momentum=0.5),
    server_optimizer=tff.learning.optimizers.build_adam(0.05),
    model_aggregator=diagnosed_mean.diagnosed_mean_factory(
        clipping=True, initial_clipping_norm=0.05))
_GEL_KW = dict(client_learning_rate=0.05, expected_steps=6,
               model_aggregator=diagnosed_mean.diagnosed_mean_factory(
                   clipping=True, initial_clipping_norm=0.05))

# Every fused builder of the package, with resident examples or not.
_BUILDERS = {
    'fedopt': lambda m, **kw: fused_checks.on_shards(fedopt.build_fedopt, m, **_FEDOPT_KW, **kw),
    'fedsgd': lambda m, **kw: fused_checks.on_shards(fedopt.build_fedsgd, 
        m, server_optimizer=tff.learning.optimizers.build_sgdm(0.5), **kw),
    'gel_fednova': lambda m, **kw: fused_checks.on_shards(gel.build_gel, 
        m, base='fednova', **_GEL_KW, **kw),
    'budgeted_fedprox': lambda m, **kw: fused_checks.on_shards(gel.build_budgeted_baseline, 
        m, base='fedprox', client_learning_rate=0.05, **kw),
}
_STATEFUL_BUILDERS = {
    'adabest': lambda m, held=None, **kw: adabest.build_adabest(
        m, mu=0.3, beta=0.6, execution=execution.OnShards(
            resident_examples=held), **kw),
    'feddyn': lambda m, held=None, **kw: feddyn.build_feddyn(
        m, population_size=10, mu=0.3, execution=execution.OnShards(
            resident_examples=held), **kw),
    'scaffold': lambda m, held=None, **kw: scaffold.build_scaffold(
        m, population_size=10, server_learning_rate=0.8,
        execution=execution.OnShards(resident_examples=held), **kw),
}


@pytest.mark.parametrize('name', sorted(_BUILDERS))
def test_a_round_on_rows_equals_the_round_on_examples(name):
  arrays, client_rows = _population()
  model_fn = tiny_models.linear_model_fn(fused_checks.NUM_FEATURES)
  sent_process = _BUILDERS[name](model_fn)
  rows_process = _BUILDERS[name](model_fn, resident_examples=_resident(arrays))
  # The same state: checkpoints carry over between the two.
  assert (rows_process.initialize.type_signature ==
          sent_process.initialize.type_signature)
  state = rows_state = sent_process.initialize()
  steps = ([3, 1, 2, 6, 2, 4, 1] if name.startswith(('gel', 'budgeted'))
           else None)
  for round_num, clients_per_shard in ((0, 3), (1, 7)):
    sent, rows = _both_shards(arrays, client_rows, clients_per_shard,
                              seed=round_num, steps=steps)
    output = sent_process.next(state, sent)
    rows_output = rows_process.next(rows_state, rows)
    fused_checks.assert_close(output.state, rows_output.state)
    fused_checks.assert_close(output.metrics, rows_output.metrics)
    state, rows_state = output.state, rows_output.state
  # The empty and the NaN client sent zeros (FedNova's mean is nested).
  zeros = [v for path, v in tree.flatten_with_path(output.metrics['aggregator'])
           if path[-1] == 'num_zero_updates']
  assert zeros == [2]
  assert not np.allclose(
      tiny_models.flat(sent_process.get_model_weights(state).trainable),
      tiny_models.flat(sent_process.get_model_weights(
          sent_process.initialize()).trainable))


@pytest.mark.parametrize('name', sorted(_STATEFUL_BUILDERS))
def test_a_stateful_round_on_rows_equals_the_round_on_examples(name):
  arrays, client_rows = _population()
  model_fn = tiny_models.linear_model_fn(fused_checks.NUM_FEATURES)
  kwargs = dict(client_learning_rate=0.1, client_learning_rate_decay=0.9)
  sent_process = _STATEFUL_BUILDERS[name](model_fn, **kwargs)
  rows_process = _STATEFUL_BUILDERS[name](
      model_fn, held=_resident(arrays), **kwargs)
  runner = runner_lib.StatefulClientRunner(sent_process)
  rows_runner = runner_lib.StatefulClientRunner(rows_process)
  state = rows_state = sent_process.initialize()
  for round_num, cohort in enumerate(([0, 1, 2, 3, 4, 5, 6], [1, 3, 4, 6])):
    ids = [str(k) for k in cohort]
    sent, rows = _both_shards(arrays, [client_rows[k] for k in cohort], 3,
                              seed=round_num)
    output = runner.next(state, ids, sent)
    rows_output = rows_runner.next(rows_state, ids, rows)
    fused_checks.assert_same_stateful_round(output, rows_output, runner,
                                            rows_runner, ids)
    state, rows_state = output.state, rows_output.state


def test_the_fused_evaluation_on_rows_equals_it_on_examples():
  arrays, client_rows = _population()
  model_fn = tiny_models.linear_model_fn(fused_checks.NUM_FEATURES)
  recipe = shards.BatchRecipe(batch_size=3, shuffle=False,
                              transform=_RECIPE.transform)
  sent = shards.shards_from_arrays(arrays, client_rows, recipe, 4,
                                   np.random.default_rng(0))
  rows = shards.shards_from_arrays(arrays, client_rows, recipe, 4,
                                   np.random.default_rng(0), rows_only=True)
  weights = tff.learning.models.ModelWeights.from_model(model_fn())
  weights = tf.nest.map_structure(lambda v: v.numpy(), weights)
  on_examples = per_client_evaluation.build_fused_per_client_evaluation(
      model_fn)(weights, sent)
  on_rows = per_client_evaluation.build_fused_per_client_evaluation(
      model_fn, resident_examples=_resident(arrays))(weights, rows)
  fused_checks.assert_close(
      [c['unfinalized'] for c in per_client_evaluation.split_clients(
          on_examples) if np.all(np.isfinite(tf.nest.flatten(c)))],
      [c['unfinalized'] for c in per_client_evaluation.split_clients(
          on_rows) if np.all(np.isfinite(tf.nest.flatten(c)))])
  assert len(per_client_evaluation.split_clients(on_rows)) == len(_SIZES)


def test_resident_examples_must_match_the_models_input():
  model_fn = tiny_models.linear_model_fn(fused_checks.NUM_FEATURES)
  arrays, _ = _population()
  wrong_width = collections.OrderedDict(x=np.zeros((4, 5), np.float32),
                                        y=arrays['y'][:4])
  wrong_dtype = collections.OrderedDict(x=arrays['x'].astype(np.float64),
                                        y=arrays['y'])
  wrong_structure = (arrays['x'], arrays['y'])
  for wrong in (wrong_width, wrong_dtype, wrong_structure):
    with pytest.raises(ValueError, match='resident examples'):
      fused_checks.on_shards(fedopt.build_fedopt, model_fn, **_FEDOPT_KW,
                               resident_examples=wrong)
  with pytest.raises(TypeError, match='execution must be'):
    adabest.build_adabest(model_fn, execution=arrays)


def test_resident_examples_gather_the_rows_of_their_files():
  arrays, _ = _population()
  arrays['k'] = np.arange(len(arrays['x']), dtype=np.int64)[:, None]
  held = resident.ResidentExamples(arrays)
  assert held.num_examples == len(arrays['x'])
  assert held.nbytes == sum(a.nbytes for a in arrays.values())
  rows = np.array([3, 0, 3, len(arrays['x']) - 1], np.int64)
  gathered = tf.function(held.gather)(tf.constant(rows))
  for name, array in arrays.items():
    np.testing.assert_array_equal(gathered[name].numpy(), array[rows])
  directory = held.directory
  # The examples' files, and the lock that marks the directory as this
  # process's (`fl_engine.scratch`).
  assert sorted(os.listdir(directory)) == sorted(
      ['0.bin', '1.bin', '2.bin', scratch.LOCK_NAME])
  held.close()
  assert not os.path.exists(directory)
  with pytest.raises(ValueError, match='closed'):
    held.gather(tf.constant(rows))


def test_resident_examples_refuse_what_they_cannot_hold():
  with pytest.raises(ValueError, match='numeric'):
    resident.ResidentExamples({'x': np.array([b'a', b'b'])})
  with pytest.raises(ValueError, match='differ in their rows'):
    resident.ResidentExamples({'x': np.zeros((3, 2), np.float32),
                             'y': np.zeros((2,), np.int32)})


def test_a_process_outlives_its_resident_examples_handle():
  # The builder keeps only the files' paths: the files stay until exit (or
  # close()), not until the handle is collected.
  arrays, client_rows = _population()
  model_fn = tiny_models.linear_model_fn(fused_checks.NUM_FEATURES)
  process = _BUILDERS['fedopt'](model_fn,
                                resident_examples=_resident(arrays))
  gc.collect()
  _, rows = _both_shards(arrays, client_rows, 3, seed=0)
  output = process.next(process.initialize(), rows)
  assert np.all(np.isfinite(tiny_models.flat(
      process.get_model_weights(output.state).trainable)))


def test_the_driver_holds_only_array_clients():
  arrays, client_rows = _population()

  class ArrayClients:  # As `tasks.synthetic`'s and `tasks.partition`'s.
    def __init__(self):
      self.arrays = arrays

    def client_rows(self, client_id):
      return client_rows[int(client_id)]

  def preprocess_fn(dataset):
    return dataset

  preprocess_fn.batch_recipe = dict(batch_size=2, transform=_RECIPE.transform)
  held = resident.resident_examples(ArrayClients(), preprocess_fn)
  gathered = tf.function(held.gather)(tf.range(len(arrays['x']),
                                                dtype=tf.int64))
  np.testing.assert_array_equal(gathered['x'].numpy(), arrays['x'] * 0.5)
  assert resident.resident_examples(ArrayClients(), lambda d: d) is None
  with pytest.raises(ValueError, match='rows_only'):
    shards.shards_for_round(ArrayClients(), lambda d: d, ['0'], 1,
                            np.random.default_rng(0), rows_only=True)
  rows = shards.shards_for_round(ArrayClients(), preprocess_fn, ['3', '0'], 1,
                                 np.random.default_rng(0), rows_only=True,
                                 max_shard_bytes=1)  # not cut: rows only
  assert [shards.num_clients(s) for s in rows] == [1, 1]
  assert sorted(rows[0]['rows']) == sorted(client_rows[3])


def _synthetic_context():
  task = synthetic.create_synthetic_task(num_clients=12, data_seed=6, seed=0)
  return algorithm_setup.BuildContext(
      task_name='synthetic', task=task, client_learning_rate=0.1,
      server_learning_rate=1.0, clients_per_round=5, num_train_clients=12,
      total_rounds=2, seed=3,
      client_optimizer=tff.learning.optimizers.build_sgdm(0.1),
      server_optimizer=tff.learning.optimizers.build_sgdm(1.0),
      model_aggregator=diagnosed_mean.diagnosed_mean_factory(clipping=True))


@pytest.mark.parametrize('family, name', [
    ('fedopt', 'fedopt'), ('gel', 'fedavgcm_gel'), ('adabest', 'adabest')])
def test_the_driver_holds_synthetics_examples(family, name):
  setups = {'fedopt': fedopt_setup, 'gel': gel_setup,
            'adabest': adabest_setup}[family].ALGORITHMS
  context = _synthetic_context()
  held = algorithm_setup.realize(setups[name](context), context)
  ids = list(context.task.datasets.train_data.client_ids)[::2][:5]
  held_shards = held.client_datasets_fn(1, ids)
  assert all(sorted(s) == ['batch_sizes', 'rows'] for s in held_shards)
  # With remote workers (--worker_addresses): shards of examples, the same
  # round.
  sent = algorithm_setup.realize(
      setups[name](context), context,
      algorithm_setup.ExecutionSettings(hold_examples=False))
  sent_shards = sent.client_datasets_fn(1, ids)
  assert all(sorted(s) == ['batch_sizes', 'examples'] for s in sent_shards)
  state = sent.process.initialize()
  if family == 'adabest':
    outputs = [runner_lib.StatefulClientRunner(s.process).next(state, ids, d)
               for s, d in ((held, held_shards), (sent, sent_shards))]
  else:
    outputs = [s.process.next(state, d)
               for s, d in ((held, held_shards), (sent, sent_shards))]
  fused_checks.assert_close(outputs[0].state, outputs[1].state)
  fused_checks.assert_close(outputs[0].metrics, outputs[1].metrics)
