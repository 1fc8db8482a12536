"""`fl_engine.worker_state`: `next` leaves the server state on the
worker, the next round takes it by reference, and the results are those of
TFF's own context on the same worker (`_plain`)."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from adabest_tff import adabest
from fl_engine import stateful_process
from fl_engine import runtime
from fl_engine import value_transfer
from fl_engine import worker_state
from large_cohort import fedopt
from tests import tiny_models


def _datasets(sizes, seed=0):
  rng = np.random.default_rng(seed)
  return [tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
      x=rng.normal(size=(n, 2)).astype(np.float32),
      y=rng.normal(size=(n, 1)).astype(np.float32))).batch(2) for n in sizes]


def _fedavg():
  return fedopt.build_fedopt(
      tiny_models.linear_model_fn(2),
      client_optimizer=tff.learning.optimizers.build_sgdm(0.1),
      server_optimizer=tff.learning.optimizers.build_sgdm(1.0, 0.9))


_INITIAL_WEIGHTS = tff.learning.models.ModelWeights(
    trainable=[np.array([[1.0], [-0.5]], np.float32),
               np.array([0.25], np.float32)],
    non_trainable=[])


def _rounds(process, cohorts):
  """Runs one round per cohort; the states, metrics, model weights."""
  state = process.set_model_weights(process.initialize(), _INITIAL_WEIGHTS)
  states, metrics = [], []
  for datasets in cohorts:
    output = process.next(state, datasets)
    state = output.state
    states.append(state)
    metrics.append(output.metrics)
  return states, metrics, process.get_model_weights(state)


def _plain(rounds_fn, *args):
  """`rounds_fn(*args)` on a worker through TFF's own context, the state sent
  both ways every round."""
  with runtime.worker_runtime():
    return rounds_fn(*args)


def _flat(value):
  return np.concatenate([np.ravel(np.asarray(v, np.float64))
                         for v in tf.nest.flatten(value)])


def _assert_same_rounds(kept, plain):
  (kept_states, kept_metrics, kept_weights) = kept
  (plain_states, plain_metrics, plain_weights) = plain
  np.testing.assert_allclose(_flat(kept_metrics), _flat(plain_metrics),
                             rtol=1e-6)
  np.testing.assert_allclose(_flat(kept_weights), _flat(plain_weights),
                             rtol=1e-6)
  np.testing.assert_allclose(_flat(kept_states[-1]), _flat(plain_states[-1]),
                             rtol=1e-6)


def test_next_leaves_the_state_on_the_worker_with_the_same_results():
  process = _fedavg()
  # The second round's cohort is smaller: another executor, to which the
  # state is sent as a value.
  cohorts = [_datasets([3, 4, 5], seed=1), _datasets([2, 6], seed=2),
             _datasets([3, 4, 5], seed=3)]
  plain = _plain(_rounds, process, cohorts)
  with runtime.worker_runtime(keep_state_on_worker=True):
    states, metrics, weights = _rounds(process, cohorts)
    assert all(isinstance(s, worker_state.StateOnWorker) for s in states)
    fetched = worker_state.fetch({'server_state': states[-1], 'round': 3})
    fetched_output = worker_state.fetch(
        tff.learning.templates.LearningProcessOutput(states[-1], metrics[-1]))
  assert isinstance(fetched['server_state'],
                    type(plain[0][-1]))  # TFF's own container
  assert fetched['round'] == 3
  # A handle outlives its runtime only to say so.
  with pytest.raises(runtime.WorkerUnavailableError,
                     match='runtime block has ended.*worker_state.fetch'):
    worker_state.fetch(states[-1])
  # A named tuple keeps its type, its states fetched.
  assert isinstance(fetched_output,
                    tff.learning.templates.LearningProcessOutput)
  np.testing.assert_allclose(_flat(fetched_output.state),
                             _flat(plain[0][-1]), rtol=1e-6)
  _assert_same_rounds(([fetched['server_state']], metrics, weights), plain)


@pytest.fixture(name='sent')
def _sent(monkeypatch):
  """The types of the values sent to workers, in order, as a list."""
  sent = []
  original = value_transfer.RemoteExecutor.create_value

  async def recording_create_value(self, value, type_spec=None):
    sent.append(type_spec)
    return await original(self, value, type_spec)

  monkeypatch.setattr(value_transfer.RemoteExecutor, 'create_value',
                      recording_create_value)
  return sent


def test_a_second_round_sends_neither_the_state_nor_the_computation(sent):
  process = _fedavg()
  state_type = process.next.type_signature.parameter[0]
  datasets = _datasets([3, 4])
  with runtime.worker_runtime(keep_state_on_worker=True):
    state = process.initialize()
    state = process.next(state, datasets).state
    first_round = list(sent)
    sent.clear()
    process.next(state, datasets)
  states_sent = [t for t in first_round
                 if t is not None and t.is_equivalent_to(state_type)]
  assert len(states_sent) == 1  # from `initialize`, as a value
  assert any(isinstance(t, tff.FunctionType) for t in first_round)
  assert not any(t is not None and t.is_equivalent_to(state_type)
                 for t in sent)
  assert not any(isinstance(t, tff.FunctionType) for t in sent)


def test_a_split_cohort_sends_its_computations_once(sent):
  process = _fedavg()
  datasets = _datasets([3, 4, 5, 2])
  with runtime.worker_runtime(max_clients_per_call=2,
                             keep_state_on_worker=True):
    state = process.initialize()
    process.next(state, datasets)
    first_round = list(sent)
    sent.clear()
    process.next(state, datasets)
  # `initialize`; two slices of 2 clients (`up_to_merge`, sent once for
  # both); the merge and finish. The next round reuses them on the worker.
  assert sum(isinstance(t, tff.FunctionType) for t in first_round) == 3
  assert not any(isinstance(t, tff.FunctionType) for t in sent)


def test_a_split_cohort_fetches_the_state_and_returns_python_values():
  process = _fedavg()
  cohorts = [_datasets([3, 4, 5], seed=1), _datasets([2, 6, 3], seed=2)]
  plain = _plain(_rounds, process, cohorts)
  with runtime.worker_runtime(max_clients_per_call=2,
                             keep_state_on_worker=True):
    split = _rounds(process, cohorts)
  assert not any(isinstance(s, worker_state.StateOnWorker) for s in split[0])
  np.testing.assert_allclose(_flat(split[2]), _flat(plain[2]), rtol=1e-5)


def test_stateful_clients_keep_their_states_and_the_server_state_stays():
  process = adabest.build_adabest(tiny_models.linear_model_fn(2), mu=0.1,
                                  beta=0.5)
  initial_client_state = process.initial_client_state()

  def rounds():
    state = process.initialize()
    client_states = [initial_client_state] * 3
    for seed in (1, 2):
      output = process.next(state, [
          stateful_process.StatefulClientInput(data, client_state)
          for data, client_state in zip(_datasets([3, 4, 5], seed),
                                        client_states)])
      state, client_states = output.state, output.client_states
    return state, client_states, output.metrics, process.get_model_weights(
        state)

  plain = _plain(rounds)
  with runtime.worker_runtime(keep_state_on_worker=True):
    kept = rounds()
    assert isinstance(kept[0], worker_state.StateOnWorker)
    kept = (worker_state.fetch(kept[0]),) + kept[1:]
  for kept_part, plain_part in zip(kept, plain):
    np.testing.assert_allclose(_flat(kept_part), _flat(plain_part),
                               rtol=1e-6)


@pytest.mark.parametrize('name, passes', [
    ('next', True), ('initialize', False), ('get_model_weights', False),
    ('set_model_weights', False)])
def test_only_next_passes_state(name, passes):
  assert worker_state.passes_state(
      getattr(_fedavg(), name).type_signature) is passes
