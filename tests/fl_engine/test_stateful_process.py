"""Stateful-client learning processes: validation, composition, round runner."""

import collections
import gc
import os

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fl_engine import client_state_store
from fl_engine import stateful_runner as runner_lib
from fl_engine import stateful_process
from tests import tiny_models

CORRECTION = 0.5  # the probe subtracts this from every gradient entry
PROBLEM = tiny_models.LinearRegressionProblem(
    seed=2, client_sizes={'a': 3, 'b': 5, 'c': 2},
    initial_kernel=[[1.0], [1.0]], initial_bias=[0.0])


# The probe's client state records what the client saw and did.
PROBE_STATE_TYPE = tff.types.to_type(collections.OrderedDict(
    rounds_seen=np.int32, round_num=np.int32, learning_rate=np.float32,
    examples_before=np.float32, num_examples=np.int64, num_steps=np.int64))


def build_probe_process(learning_rate=0.1, decay=0.5):
  """Corrected local SGD; the server counts examples and broadcasts them."""
  weights_type = stateful_process.model_weights_type(PROBLEM.model_fn)

  def client_update(model, work_input, data, context):
    training = stateful_process.local_sgd_with_correction(
        model, data, context.learning_rate,
        lambda gradients, _: [g - CORRECTION for g in gradients])
    state = work_input.client_state
    new_state = collections.OrderedDict(
        rounds_seen=state['rounds_seen'] + 1,
        round_num=context.round_num,
        learning_rate=context.learning_rate,
        examples_before=context.server_values,
        num_examples=training.num_examples,
        num_steps=training.num_steps)
    result = stateful_process.guarded_client_result(
        stateful_process.model_delta(work_input.model_weights.trainable,
                                     model),
        tf.constant(1.0), new_state, state)
    return result, tf.cast(training.num_examples, tf.float32)

  client_work = stateful_process.build_stateful_client_work(
      PROBLEM.model_fn,
      client_state_type=PROBE_STATE_TYPE,
      client_update_fn=client_update,
      initial_server_values_fn=lambda: tf.constant(0.0),
      broadcast_values_fn=lambda total: total,
      server_values_update_fn=lambda total, examples: total + examples,
      client_learning_rate=learning_rate,
      client_learning_rate_decay=decay)

  @tff.tensorflow.computation
  def initial_client_state():
    return collections.OrderedDict(
        rounds_seen=tf.constant(0), round_num=tf.constant(0),
        learning_rate=tf.constant(0.0), examples_before=tf.constant(0.0),
        num_examples=tf.constant(0, tf.int64),
        num_steps=tf.constant(0, tf.int64))

  return stateful_process.compose_stateful_learning_process(
      stateful_process.build_initial_model_weights_fn(PROBLEM.model_fn),
      tff.learning.templates.build_broadcast_process(weights_type),
      client_work,
      tff.aggregators.MeanFactory().create(weights_type.trainable,
                                           tff.TensorType(np.float32)),
      tff.learning.templates.build_apply_optimizer_finalizer(
          tff.learning.optimizers.build_sgdm(1.0), weights_type),
      initial_client_state)


def reference_client_model(weights, client_id, learning_rate):
  features, labels = PROBLEM.client_data[client_id]
  for start in range(0, len(labels), PROBLEM.batch_size):
    batch = slice(start, start + PROBLEM.batch_size)
    gradient = PROBLEM.loss_gradient(weights, features[batch], labels[batch])
    weights = weights - learning_rate * (gradient - CORRECTION)
  return weights


@pytest.fixture(scope='module')
def probe():
  return build_probe_process()


def test_is_a_learning_process_with_client_state_types(probe):
  assert isinstance(probe, tff.learning.templates.LearningProcess)
  assert probe.client_state_type.is_equivalent_to(PROBE_STATE_TYPE)
  result_type = probe.next.type_signature.result
  assert result_type.client_states.placement is tff.CLIENTS
  assert result_type.metrics.placement is tff.SERVER


def test_two_rounds_thread_states_context_and_corrected_sgd(probe):
  state = probe.initialize()
  fresh = probe.initial_client_state()
  weights = tiny_models.flat(probe.get_model_weights(state).trainable)
  states = {}
  examples_so_far = 0.0
  for round_num, cohort in ((1, ('b', 'a')), (2, ('c', 'b'))):
    output = probe.next(state, [
        stateful_process.StatefulClientInput(PROBLEM.dataset(cid),
                                             states.get(cid, fresh))
        for cid in cohort
    ])
    learning_rate = 0.1 * 0.5**(round_num - 1)
    for cid, client_state in zip(cohort, output.client_states):
      assert client_state['round_num'] == round_num
      np.testing.assert_allclose(client_state['learning_rate'], learning_rate)
      assert client_state['examples_before'] == examples_so_far
      assert client_state['num_examples'] == len(PROBLEM.client_data[cid][1])
      assert client_state['num_steps'] == -(
          -len(PROBLEM.client_data[cid][1]) // PROBLEM.batch_size)
      assert client_state['rounds_seen'] == (
          states[cid]['rounds_seen'] + 1 if cid in states else 1)
    states.update(zip(cohort, output.client_states))
    examples_so_far += sum(len(PROBLEM.client_data[cid][1]) for cid in cohort)
    weights = np.mean([reference_client_model(weights, cid, learning_rate)
                       for cid in cohort], axis=0)
    state = output.state
    np.testing.assert_allclose(
        tiny_models.flat(probe.get_model_weights(state).trainable), weights,
        atol=1e-6)
    np.testing.assert_allclose(output.metrics['model_norms']
                               ['deployed_model_norm'],
                               np.linalg.norm(weights), rtol=1e-5)
    assert output.metrics['client_work']['train']['num_examples'] == sum(
        len(PROBLEM.client_data[cid][1]) for cid in cohort)


def test_run_round_loads_and_saves_states_in_the_store(probe, tmp_path):
  store = client_state_store.ClientStateStore(
      str(tmp_path), probe.initial_client_state())
  state = probe.initialize()
  for round_num, cohort in ((1, ['a', 'b']), (2, ['b', 'c'])):
    output = stateful_process.run_round(
        probe, state, cohort, [PROBLEM.dataset(cid) for cid in cohort], store,
        round_num)
    assert isinstance(output, tff.learning.templates.LearningProcessOutput)
    state = output.state
  store.commit(2)
  reopened = client_state_store.ClientStateStore(
      str(tmp_path), probe.initial_client_state())
  a, b, c = reopened.load(['a', 'b', 'c'])
  assert (a['rounds_seen'], b['rounds_seen'], c['rounds_seen']) == (1, 2, 1)
  assert (a['round_num'], b['round_num'], c['round_num']) == (1, 2, 2)
  with pytest.raises(ValueError, match='2 client ids and 1 clients in 1 datasets'):
    stateful_process.run_round(probe, state, ['a', 'b'], [PROBLEM.dataset('a')],
                               store, 3)


def test_resume_from_a_checkpoint_repeats_the_uninterrupted_run(
    probe, tmp_path):
  cohorts = {1: ['a', 'b'], 2: ['b', 'c'], 3: ['a', 'b'], 4: ['c', 'a']}
  fresh = probe.initial_client_state()

  def run(store, state, rounds):
    for round_num in rounds:
      cohort = cohorts[round_num]
      state = stateful_process.run_round(
          probe, state, cohort, [PROBLEM.dataset(cid) for cid in cohort], store,
          round_num).state
    return state

  straight_store = client_state_store.ClientStateStore(
      str(tmp_path / 'straight'), fresh)
  straight = run(straight_store, probe.initialize(), [1, 2, 3, 4])

  crashed_dir = str(tmp_path / 'crashed')
  store = client_state_store.ClientStateStore(crashed_dir, fresh)
  checkpoint = run(store, probe.initialize(), [1, 2])
  store.commit(2)
  run(store, checkpoint, [3])  # then the process dies
  resumed_store = client_state_store.ClientStateStore(crashed_dir, fresh)
  resumed_store.restore(2)
  resumed = run(resumed_store, checkpoint, [3, 4])

  np.testing.assert_allclose(
      tiny_models.flat(probe.get_model_weights(resumed).trainable),
      tiny_models.flat(probe.get_model_weights(straight).trainable))
  for ours, theirs in zip(resumed_store.load(['a', 'b', 'c']),
                          straight_store.load(['a', 'b', 'c'])):
    assert ours['rounds_seen'] == theirs['rounds_seen']
    assert ours['round_num'] == theirs['round_num']
    assert ours['examples_before'] == theirs['examples_before']


def test_non_finite_client_work_is_discarded():
  old_state = collections.OrderedDict(h=tf.constant([1.0, 2.0]),
                                      last_round=tf.constant(3))
  new_state = collections.OrderedDict(h=tf.constant([np.nan, 0.0]),
                                      last_round=tf.constant(4))
  result = stateful_process.guarded_client_result(
      [tf.constant([0.5, 0.5])], tf.constant(7.0), new_state, old_state)
  assert result.update_weight.numpy() == 0.0
  np.testing.assert_array_equal(result.update.model_update[0].numpy(), 0.0)
  np.testing.assert_array_equal(result.update.client_state['h'].numpy(),
                                [1.0, 2.0])
  assert result.update.client_state['last_round'].numpy() == 3
  kept = stateful_process.guarded_client_result(
      [tf.constant([0.5, 0.5])], tf.constant(7.0), old_state, old_state)
  assert kept.update_weight.numpy() == 7.0


def test_rejects_a_next_without_client_states():
  @tff.federated_computation
  def initialize():
    return tff.federated_value(0, tff.SERVER)

  client_input = tff.FederatedType(
      tff.StructWithPythonType(
          [('data', tff.SequenceType(np.float32)), ('client_state', np.int32)],
          stateful_process.StatefulClientInput), tff.CLIENTS)

  @tff.federated_computation(initialize.type_signature.result, client_input)
  def plain_next(state, client_inputs):
    del client_inputs
    return tff.learning.templates.LearningProcessOutput(state, state)

  @tff.federated_computation(initialize.type_signature.result, client_input)
  def next_with_other_states(state, client_inputs):
    return stateful_process.StatefulLearningProcessOutput(
        state, state, tff.federated_map(
            tff.tensorflow.computation(lambda s: tf.cast(s, tf.float32),
                                       np.int32),
            client_inputs.client_state))

  identity = tff.tensorflow.computation(lambda s: s, np.int32)
  replace = tff.tensorflow.computation(lambda s, w: w, np.int32, np.int32)
  fresh = tff.tensorflow.computation(lambda: tf.constant(0))
  with pytest.raises(
      tff.learning.templates.learning_process.LearningProcessOutputError,
      match='StatefulLearningProcessOutput'):
    stateful_process.StatefulClientLearningProcess(
        initialize, plain_next, identity, replace, fresh)
  with pytest.raises(stateful_process.ClientStateTypeError,
                     match='client_states'):
    stateful_process.StatefulClientLearningProcess(
        initialize, next_with_other_states, identity, replace, fresh)


def test_decayed_learning_rate_and_bad_arguments():
  np.testing.assert_allclose(
      stateful_process.decayed_learning_rate(0.1, 0.998, tf.constant(11)),
      0.1 * 0.998**10, rtol=1e-6)
  with pytest.raises(ValueError, match='-1.0'):
    stateful_process.check_learning_rate_args(-1.0, 0.998)
  with pytest.raises(ValueError, match='with_deployed_model_weights_fn'):
    stateful_process.compose_stateful_learning_process(
        None, None, None, None, None, None,
        with_deployed_model_weights_fn=lambda state, weights: state)


@pytest.mark.parametrize('population_size', [0, -3, 2.5, '4'])
def test_population_size_must_be_a_positive_int(population_size):
  stateful_process.check_population_size(1)
  with pytest.raises(ValueError, match=repr(population_size)):
    stateful_process.check_population_size(population_size)


def test_initial_model_weights_are_a_new_models():
  weights = stateful_process.build_initial_model_weights_fn(
      PROBLEM.model_fn)()
  np.testing.assert_array_equal(tiny_models.flat(weights.trainable),
                                PROBLEM.initial_weights())
  assert not weights.non_trainable


def test_a_runner_without_a_store_removes_its_directory():
  runner = runner_lib.StatefulClientRunner(build_probe_process())
  directory = runner.store.directory
  runner.next(runner.initialize(), ['a'], [PROBLEM.dataset('a')])
  assert os.listdir(directory)
  del runner
  gc.collect()
  assert not os.path.exists(directory)


def test_a_runner_refuses_an_older_server_state_naming_the_round():
  runner = runner_lib.StatefulClientRunner(build_probe_process())
  first = runner.initialize()
  state = runner.next(first, ['a'], [PROBLEM.dataset('a')]).state
  state = runner.next(state, ['a'], [PROBLEM.dataset('a')]).state
  with pytest.raises(ValueError, match='not the one round 2 returned'):
    runner.next(first, ['a'], [PROBLEM.dataset('a')])  # a cell re-run
  runner.next(state, ['a'], [PROBLEM.dataset('a')])  # the latest: accepted
