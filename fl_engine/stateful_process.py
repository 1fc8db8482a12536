"""Learning processes whose clients keep a state from one round to the next.

AdaBest, FedDyn and SCAFFOLD (Varno et al. 2022, Algorithm 1) keep a vector per
client (`h_i` or `c_i`, plus AdaBest's last round `t'_i`) that survives between
the rounds the client takes part in. TFF's
`tff.learning.templates.LearningProcess` has no place for such state: its
`next` must return `LearningProcessOutput(state, metrics)`, both at `SERVER`.
This module adds the missing piece and nothing else:

* `StatefulClientLearningProcess`, a `LearningProcess` whose `next` is

      (<S@SERVER, {StatefulClientInput(data, client_state)}@CLIENTS>
       -> StatefulLearningProcessOutput(state@SERVER, metrics@SERVER,
                                        client_states@CLIENTS))

  The new client states come back to Python as a list, one per client, in
  the order the clients were given. `get_model_weights`, `set_model_weights`,
  `get_hparams` and `set_hparams` work as for any `LearningProcess`.
* `compose_stateful_learning_process`, the stateful counterpart of
  `tff.learning.templates.compose_learning_process`: it chains TFF's four
  slots (distributor, client work, aggregator, finalizer). The client work is
  an ordinary `tff.learning.templates.ClientWorkProcess` that carries the
  client state through its existing types: its second argument (the
  broadcast "model weights" in FedAvg) is `StatefulClientWorkInput(
  model_weights, client_state)` and its `ClientResult.update` is
  `StatefulClientUpdate(model_update, client_state)`; only `model_update`
  reaches the aggregator, `client_state` goes back to the clients' storage.
* `build_stateful_client_work`, that client work for the three algorithms:
  a round counter and the client learning-rate schedule in its server state,
  broadcast with algorithm-specific server values (`RoundContext`), and an
  algorithm-specific client step built on `local_sgd_with_correction` (SGD
  steps on a corrected gradient).
* `StatefulClientSteps` (an algorithm's client as corrected SGD steps
  between `prepare` and `conclude`) and `StatefulAlgorithm` (its client,
  server values and finalizer): what each of the three algorithms defines,
  composed per client by `compose_algorithm` or on shards of clients by
  `fl_engine.fused_stateful.compose_fused` (`execution=OnShards(...)` of the
  builders; a TFF client then trains a shard, its clients' states stacked).
* `run_round`, which a training loop calls each round to load the cohort's
  states from a `client_state_store.ClientStateStore`, run `next` and save the
  new states (stacking and unstacking them around a process on shards).

Why one module: the process type, its composition, the shared client work and
`run_round` change together whenever the client-state contract changes (the
NumPy-reference tests of all three algorithms exercise them as one). Moving
the TF helpers and type utilities out is the next split.
"""

import collections
import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from fl_engine import client_state_store
from fl_engine import fused
from fl_engine import shards

LearningAlgorithmState = tff.learning.templates.LearningAlgorithmState


class StatefulClientInput(NamedTuple):
  """What one client brings to a round: its data and its stored state."""

  data: Any
  client_state: Any


class StatefulClientWorkInput(NamedTuple):
  """The second argument of a stateful `ClientWorkProcess.next`, per client."""

  model_weights: Any
  client_state: Any


class StatefulClientUpdate(NamedTuple):
  """The `update` of a stateful client work's `ClientResult`.

  Attributes:
    model_update: What the client sends to the server; aggregated.
    client_state: The client's new state; stays on the client.
  """

  model_update: Any
  client_state: Any


class StatefulLearningProcessOutput(NamedTuple):
  """The output of `StatefulClientLearningProcess.next`.

  Attributes:
    state: The new server state (as in `LearningProcessOutput`).
    metrics: The round's metrics at `SERVER` (as in `LearningProcessOutput`).
    client_states: The participating clients' new states, at `CLIENTS`.
  """

  state: Any
  metrics: Any
  client_states: Any


class ClientStateTypeError(TypeError):
  """The client-state types of a stateful process do not fit together."""


class StatefulClientLearningProcess(tff.learning.templates.LearningProcess):
  """A `LearningProcess` whose `next` also takes and returns client states.

  `LearningProcess.__init__` rejects any `next` whose result is not a
  `LearningProcessOutput`; that single check cannot hold here. Every other
  check of `LearningProcess` (initialize at `SERVER`, two arguments, the
  second at `CLIENTS`, metrics at `SERVER`, the model-weights and hparams
  accessors typed against the state) is run by `LearningProcess.__init__`
  itself, on a view of `next` that drops `client_states`. This class then
  checks what is new: the result container, `client_states` placed at
  `CLIENTS` with the type of `initial_client_state`, and the client-state
  member of the second argument having that same type.
  """

  def __init__(
      self,
      initialize_fn: tff.Computation,
      next_fn: tff.Computation,
      get_model_weights: tff.Computation,
      set_model_weights: tff.Computation,
      initial_client_state: tff.Computation,
      *,
      get_hparams_fn: Optional[tff.Computation] = None,
      set_hparams_fn: Optional[tff.Computation] = None,
      on_shards: bool = False,
  ):
    """Creates the process.

    Args:
      initialize_fn: `( -> S@SERVER)`.
      next_fn: `(<S@SERVER, {StatefulClientInput(D*, C)}@CLIENTS> ->
        StatefulLearningProcessOutput(S@SERVER, M@SERVER, {C}@CLIENTS))`.
      get_model_weights: `(S -> W)`.
      set_model_weights: `(<S, W> -> S)`.
      initial_client_state: `( -> C)`, unplaced: the state of a client that
        has never taken part.
      get_hparams_fn: Optional `(S -> H)`.
      set_hparams_fn: Optional `(<S, H> -> S)`.
      on_shards: Whether a TFF client is a shard of clients
        (`fl_engine.fused_stateful`): its data a shard (`fl_engine.shards`), its
        client state and new client state the shard's clients' states
        stacked (`C` with a leading dimension, `fl_engine.fused.stacked_type`).

    Raises:
      ClientStateTypeError: If the client-state types do not match.
      (and every error `tff.learning.templates.LearningProcess` raises.)
    """
    result_type = next_fn.type_signature.result
    if not (isinstance(result_type, tff.StructWithPythonType) and
            result_type.python_container is StatefulLearningProcessOutput):
      raise tff.learning.templates.learning_process.LearningProcessOutputError(
          'The `next_fn` of a `StatefulClientLearningProcess` must return a '
          f'`StatefulLearningProcessOutput`, but returns {result_type}.')

    @tff.federated_computation(next_fn.type_signature.parameter)
    def next_without_client_states(state, client_inputs):
      output = next_fn(state, client_inputs)
      return tff.learning.templates.LearningProcessOutput(
          output.state, output.metrics)

    super().__init__(
        initialize_fn,
        next_without_client_states,
        get_model_weights,
        set_model_weights,
        get_hparams_fn=get_hparams_fn,
        set_hparams_fn=set_hparams_fn,
    )
    client_state_type = initial_client_state.type_signature.result
    if (initial_client_state.type_signature.parameter is not None or
        isinstance(client_state_type, tff.FederatedType)):
      raise ClientStateTypeError(
          '`initial_client_state` must be a no-arg computation with an '
          f'unplaced result, found {initial_client_state.type_signature}.')
    if on_shards:
      client_state_type = fused.stacked_type(client_state_type)
    client_states_type = result_type.client_states
    if (not isinstance(client_states_type, tff.FederatedType) or
        client_states_type.placement is not tff.CLIENTS or
        not client_states_type.member.is_equivalent_to(client_state_type)):
      raise ClientStateTypeError(
          '`next_fn` must return `client_states` of type '
          f'{tff.FederatedType(client_state_type, tff.CLIENTS)}, found '
          f'{client_states_type}.')
    client_input_type = next_fn.type_signature.parameter[1].member
    if not (isinstance(client_input_type, tff.StructWithPythonType) and
            client_input_type.python_container is StatefulClientInput and
            client_input_type.client_state.is_equivalent_to(
                client_state_type)):
      raise ClientStateTypeError(
          'The second argument of `next_fn` must be `StatefulClientInput('
          f'data, client_state={client_state_type})` at CLIENTS, found '
          f'{client_input_type}.')
    self._next_fn = next_fn
    self._initial_client_state = initial_client_state
    self._on_shards = on_shards

  @property
  def next(self) -> tff.Computation:
    """One round; see the class docstring for its type signature."""
    return self._next_fn

  @property
  def initial_client_state(self) -> tff.Computation:
    """A no-arg computation: the state of a client new to training."""
    return self._initial_client_state

  @property
  def on_shards(self) -> bool:
    """Whether a TFF client is a shard of clients (see `__init__`)."""
    return self._on_shards

  @property
  def client_state_type(self) -> tff.Type:
    """The (unplaced) type of one client's state."""
    return self._initial_client_state.type_signature.result


def compose_stateful_learning_process(
    initial_model_weights_fn: tff.Computation,
    model_weights_distributor: tff.learning.templates.DistributionProcess,
    client_work: tff.learning.templates.ClientWorkProcess,
    model_update_aggregator: tff.templates.AggregationProcess,
    model_finalizer: tff.learning.templates.FinalizerProcess,
    initial_client_state: tff.Computation,
    *,
    deployed_model_weights_fn: Optional[Callable[[Any], Any]] = None,
    with_deployed_model_weights_fn: Optional[Callable[[Any, Any], Any]] = None,
) -> StatefulClientLearningProcess:
  """Chains TFF's four learning-process slots around stateful clients.

  As `tff.learning.templates.compose_learning_process`, with the client
  states threaded through: per round,

  1. `model_weights_distributor` sends `state.global_model_weights` (the model
     the clients start from) to the clients;
  2. `client_work.next(state.client_work, StatefulClientWorkInput(weights,
     client_state), data)` trains and returns `StatefulClientUpdate`s;
  3. `model_update_aggregator` aggregates their `model_update`s (weighted by
     `update_weight`);
  4. `model_finalizer` turns the aggregate into the new global weights.

  The metrics are those of the four slots plus `model_norms`: the L2 norms of
  the global (broadcast) model and of the deployed model.

  Args:
    initial_model_weights_fn: A no-arg `tff.Computation` returning unplaced
      `tff.learning.models.ModelWeights`.
    model_weights_distributor: Broadcasts the global model weights.
    client_work: A `ClientWorkProcess` whose second argument is
      `StatefulClientWorkInput` and whose `ClientResult.update` is
      `StatefulClientUpdate`.
    model_update_aggregator: A weighted `AggregationProcess` for
      `StatefulClientUpdate.model_update`.
    model_finalizer: A `FinalizerProcess` taking the aggregate.
    initial_client_state: A no-arg `tff.Computation`: a fresh client's state.
    deployed_model_weights_fn: Optional TF function `state -> ModelWeights`
      for algorithms that deploy another model than the one they broadcast
      (AdaBest and FedDyn deploy `x̄ = x + h`); the default deploys
      `state.global_model_weights`. Becomes `get_model_weights`.
    with_deployed_model_weights_fn: Optional TF function `(state, weights) ->
      state` inverse to `deployed_model_weights_fn` (after it,
      `deployed_model_weights_fn` returns `weights`). Becomes
      `set_model_weights`; required with `deployed_model_weights_fn`.

  Returns:
    A `StatefulClientLearningProcess`.

  Raises:
    ValueError: If only one of the two deployed-weights functions is given.
    TypeError: If the slots' types do not chain.
  """
  if (deployed_model_weights_fn is None) != (
      with_deployed_model_weights_fn is None):
    given = ('deployed_model_weights_fn' if deployed_model_weights_fn
             else 'with_deployed_model_weights_fn')
    raise ValueError(
        'deployed_model_weights_fn and with_deployed_model_weights_fn must be '
        f'given together, found only {given}.')
  if not model_update_aggregator.is_weighted:
    raise TypeError('model_update_aggregator must be weighted.')
  client_work_param = client_work.next.type_signature.parameter
  client_data_type = client_work_param[2].member
  client_input_type = client_work_param[1].member
  if not (isinstance(client_input_type, tff.StructWithPythonType) and
          client_input_type.python_container is StatefulClientWorkInput):
    raise TypeError(
        'The second argument of client_work.next must be '
        f'StatefulClientWorkInput at CLIENTS, found {client_input_type}.')
  client_state_type = initial_client_state.type_signature.result
  client_inputs_type = tff.FederatedType(
      tff.StructWithPythonType(
          [('data', client_data_type), ('client_state', client_state_type)],
          StatefulClientInput),
      tff.CLIENTS)

  @tff.federated_computation()
  def init_fn():
    return tff.federated_zip(LearningAlgorithmState(
        tff.federated_eval(initial_model_weights_fn, tff.SERVER),
        model_weights_distributor.initialize(),
        client_work.initialize(),
        model_update_aggregator.initialize(),
        model_finalizer.initialize()))

  state_type = init_fn.type_signature.result.member

  model_weights = model_weights_functions(state_type,
                                          deployed_model_weights_fn,
                                          with_deployed_model_weights_fn)

  @tff.federated_computation(init_fn.type_signature.result,
                             client_inputs_type)
  def next_fn(state, client_inputs):
    distributor_output = model_weights_distributor.next(
        state.distributor, state.global_model_weights)
    client_work_input = tff.federated_zip(StatefulClientWorkInput(
        distributor_output.result, client_inputs.client_state))
    client_work_output = client_work.next(
        state.client_work, client_work_input, client_inputs.data)
    client_update = client_work_output.result.update
    aggregator_output = model_update_aggregator.next(
        state.aggregator, client_update.model_update,
        client_work_output.result.update_weight)
    finalizer_output = model_finalizer.next(
        state.finalizer, state.global_model_weights, aggregator_output.result)
    new_state = tff.federated_zip(LearningAlgorithmState(
        finalizer_output.result, distributor_output.state,
        client_work_output.state, aggregator_output.state,
        finalizer_output.state))
    metrics = tff.federated_zip(collections.OrderedDict(
        distributor=distributor_output.measurements,
        client_work=client_work_output.measurements,
        aggregator=aggregator_output.measurements,
        finalizer=finalizer_output.measurements,
        model_norms=tff.federated_map(model_weights.norms, new_state)))
    return StatefulLearningProcessOutput(new_state, metrics,
                                         client_update.client_state)

  get_hparams_fn, set_hparams_fn = hparams_functions(state_type,
                                                     model_finalizer,
                                                     client_work)
  return StatefulClientLearningProcess(
      init_fn,
      next_fn,
      model_weights.get,
      model_weights.set,
      initial_client_state,
      get_hparams_fn=get_hparams_fn,
      set_hparams_fn=set_hparams_fn,
  )


class ModelWeightsFunctions(NamedTuple):
  """A stateful process's model-weights computations (on its state)."""

  get: tff.Computation  # (S -> W): the deployed model
  set: tff.Computation  # (<S, W> -> S)
  norms: tff.Computation  # (S -> OrderedDict(global_model_norm, ...))


def model_weights_functions(
    state_type: tff.Type,
    deployed_model_weights_fn: Optional[Callable[[Any], Any]] = None,
    with_deployed_model_weights_fn: Optional[Callable[[Any, Any], Any]] = None,
) -> ModelWeightsFunctions:
  """`get_model_weights`, `set_model_weights` and the `model_norms` metrics
  of a `LearningAlgorithmState` (arguments as
  `compose_stateful_learning_process`'s)."""

  @tff.tensorflow.computation(state_type)
  def get_model_weights_fn(state):
    if deployed_model_weights_fn is None:
      return state.global_model_weights
    return deployed_model_weights_fn(state)

  @tff.tensorflow.computation(state_type,
                              state_type.global_model_weights)
  def set_model_weights_fn(state, model_weights):
    if with_deployed_model_weights_fn is None:
      return LearningAlgorithmState(model_weights, state.distributor,
                                    state.client_work, state.aggregator,
                                    state.finalizer)
    return with_deployed_model_weights_fn(state, model_weights)

  @tff.tensorflow.computation(state_type)
  def model_norms_fn(state):
    return collections.OrderedDict(
        global_model_norm=tf.linalg.global_norm(
            tf.nest.flatten(state.global_model_weights.trainable)),
        deployed_model_norm=tf.linalg.global_norm(
            tf.nest.flatten(get_model_weights_fn(state).trainable)))

  return ModelWeightsFunctions(get_model_weights_fn, set_model_weights_fn,
                               model_norms_fn)


def hparams_functions(
    state_type: tff.Type,
    finalizer: tff.learning.templates.FinalizerProcess,
    client_work: Optional[tff.learning.templates.ClientWorkProcess] = None,
) -> tuple[tff.Computation, tff.Computation]:
  """`(get_hparams, set_hparams)` of a `LearningAlgorithmState`: the client
  work's (`build_stateful_client_work`'s have none: an empty `OrderedDict`,
  also when `client_work` is None) and the finalizer's."""

  def client_work_hparams(state):
    if client_work is None:
      return collections.OrderedDict()
    return client_work.get_hparams(state)

  def with_client_work_hparams(state, hparams):
    if client_work is None:
      return state
    return client_work.set_hparams(state, hparams)

  @tff.tensorflow.computation(state_type)
  def get_hparams_fn(state):
    return collections.OrderedDict(
        client_work=client_work_hparams(state.client_work),
        finalizer=finalizer.get_hparams(state.finalizer))

  @tff.tensorflow.computation(state_type, get_hparams_fn.type_signature.result)
  def set_hparams_fn(state, hparams):
    return LearningAlgorithmState(
        state.global_model_weights, state.distributor,
        with_client_work_hparams(state.client_work, hparams['client_work']),
        state.aggregator,
        finalizer.set_hparams(state.finalizer, hparams['finalizer']))

  return get_hparams_fn, set_hparams_fn


class RoundContext(NamedTuple):
  """What the server broadcasts to each client of a round, besides the model.

  Attributes:
    round_num: The 1-based round number `t`.
    learning_rate: The client step size `η_t` of the round.
    server_values: The algorithm's own broadcast values (e.g. SCAFFOLD's
      control variate `c`).
  """

  round_num: Any
  learning_rate: Any
  server_values: Any


# (model, StatefulClientWorkInput, data, RoundContext) ->
#   (ClientResult(StatefulClientUpdate, weight), values summed over clients).
ClientUpdateFn = Callable[
    [tff.learning.models.VariableModel, StatefulClientWorkInput,
     tf.data.Dataset, RoundContext],
    tuple[tff.learning.templates.ClientResult, Any]]


class StatefulClientSteps(NamedTuple):
  """A stateful client as corrected SGD steps between two functions.

  AdaBest, FedDyn and SCAFFOLD differ only in these three functions (Varno
  et al. 2022, Algorithm 1); one client update runs them on a client's
  dataset (`client_update_from_steps`, per client) and `fl_engine.fused_stateful`
  on the clients of a shard, so both paths compute the same thing.

  Attributes:
    prepare: `(client_state, cloud_model, context, num_examples_fn) -> aux`,
      before the first step: what the correction needs (e.g. `h_i`, FedDyn's
      `μ_i`). `cloud_model` is the broadcast trainable weights (a flat list),
      `num_examples_fn()` the number of examples the client will process
      (only counted where called).
    correction: `(aux, gradients, trainable) -> gradients`, flat lists: the
      corrected local gradient (`local_sgd_with_correction`).
    conclude: `(client_state, aux, pseudo_gradient, training, context) ->
      (ClientResult(StatefulClientUpdate, weight), values summed over
      clients)` after the last step; `pseudo_gradient` is `x − θ_K` (a flat
      list) and `training` the `LocalTrainingResult`.
  """

  prepare: Callable[[Any, list[tf.Tensor], RoundContext,
                     Callable[[], tf.Tensor]], Any]
  correction: Callable[[Any, list[tf.Tensor], list[tf.Variable]],
                       list[tf.Tensor]]
  conclude: Callable[[Any, Any, list[tf.Tensor], 'LocalTrainingResult',
                      RoundContext],
                     tuple[tff.learning.templates.ClientResult, Any]]


def count_examples(data: tf.data.Dataset) -> tf.Tensor:
  """The number of examples in `data` (the leading dim of each batch)."""
  return data.reduce(
      tf.constant(0, tf.int64),
      lambda count, batch: count + tf.shape(
          tf.nest.flatten(batch)[0], out_type=tf.int64)[0])


def client_update_from_steps(steps: StatefulClientSteps) -> ClientUpdateFn:
  """The per-client `ClientUpdateFn` that runs `steps` over a dataset."""

  def client_update(model, work_input, data, context):
    cloud_model = tf.nest.flatten(work_input.model_weights.trainable)
    aux = steps.prepare(work_input.client_state, cloud_model, context,
                        lambda: count_examples(data))
    training = local_sgd_with_correction(
        model, data, context.learning_rate,
        lambda gradients, trainable: steps.correction(aux, gradients,
                                                      trainable))
    return steps.conclude(work_input.client_state, aux,
                          model_delta(cloud_model, model), training, context)

  return client_update


class ClientWorkState(NamedTuple):
  """The client work's server-side computations (TFF computations).

  Attributes:
    initial: `( -> OrderedDict(round_num, server_values))`.
    round_context: `(state -> RoundContext)`: what is broadcast.
    build_update: `summed values type -> (<state, summed values> ->
      state)`: the type of the summed values is the client update's.
  """

  initial: tff.Computation
  round_context: tff.Computation
  build_update: Callable[[tff.Type], tff.Computation]


def client_work_state(
    *,
    initial_server_values_fn: Callable[[], Any],
    broadcast_values_fn: Callable[[Any], Any],
    server_values_update_fn: Callable[[Any, Any], Any],
    client_learning_rate: float,
    client_learning_rate_decay: float,
) -> ClientWorkState:
  """The state of `build_stateful_client_work`'s client work and the
  computations around it: a round counter and the algorithm's server values
  (arguments as `build_stateful_client_work`'s)."""
  check_learning_rate_args(client_learning_rate, client_learning_rate_decay)

  @tff.tensorflow.computation
  def initial_state_fn():
    return collections.OrderedDict(round_num=tf.constant(0, tf.int32),
                                   server_values=initial_server_values_fn())

  state_type = initial_state_fn.type_signature.result

  @tff.tensorflow.computation(state_type)
  def round_context_fn(state):
    round_num = state['round_num'] + 1
    return RoundContext(
        round_num,
        decayed_learning_rate(client_learning_rate,
                              client_learning_rate_decay, round_num),
        broadcast_values_fn(state['server_values']))

  def build_update(summed_type):

    @tff.tensorflow.computation(state_type, summed_type)
    def update_state_fn(state, sums):
      return collections.OrderedDict(
          round_num=state['round_num'] + 1,
          server_values=server_values_update_fn(state['server_values'],
                                                sums))

    return update_state_fn

  return ClientWorkState(initial_state_fn, round_context_fn, build_update)


def build_stateful_client_work(
    model_fn: Callable[[], tff.learning.models.VariableModel],
    *,
    client_state_type: tff.Type,
    client_update_fn: ClientUpdateFn,
    initial_server_values_fn: Callable[[], Any],
    broadcast_values_fn: Callable[[Any], Any],
    server_values_update_fn: Callable[[Any, Any], Any],
    client_learning_rate: float,
    client_learning_rate_decay: float,
    metrics_aggregator: Optional[Callable[..., tff.Computation]] = None,
) -> tff.learning.templates.ClientWorkProcess:
  """Builds the client work shared by AdaBest, FedDyn and SCAFFOLD.

  Its server state is `OrderedDict(round_num, server_values)`. Each round:

  1. the server broadcasts `RoundContext(t, η_t, broadcast_values_fn(
     server_values))` with `t = round_num + 1` and
     `η_t = client_learning_rate · client_learning_rate_decay^(t−1)`;
  2. each client, with its model set to the received weights, runs
     `client_update_fn`, which trains, updates the client state and returns a
     `ClientResult(StatefulClientUpdate(model_update, client_state), weight)`
     and values to sum over the cohort;
  3. the server sums those values (`tff.federated_sum`) and sets
     `server_values = server_values_update_fn(server_values, sums)`,
     `round_num = t`.

  The measurements are the model's training metrics, aggregated by
  `metrics_aggregator` (default `tff.learning.metrics.sum_then_finalize`).

  Args:
    model_fn: A no-arg function returning a new
      `tff.learning.models.VariableModel`.
    client_state_type: The unplaced type of one client's state.
    client_update_fn: The algorithm's client step, run in a `tf.function`
      (e.g. `client_update_from_steps(steps)`).
    initial_server_values_fn: TF function `() -> server_values`.
    broadcast_values_fn: TF function `server_values -> broadcast values`.
    server_values_update_fn: TF function `(server_values, sums) ->
      server_values`.
    client_learning_rate: `η_1`.
    client_learning_rate_decay: The per-round decay factor of `η`.
    metrics_aggregator: Optional, as in `tff.learning.algorithms`.

  Returns:
    A `tff.learning.templates.ClientWorkProcess` whose second argument is
    `StatefulClientWorkInput`.
  """
  work_state = client_work_state(
      initial_server_values_fn=initial_server_values_fn,
      broadcast_values_fn=broadcast_values_fn,
      server_values_update_fn=server_values_update_fn,
      client_learning_rate=client_learning_rate,
      client_learning_rate_decay=client_learning_rate_decay)
  metrics_aggregator = (metrics_aggregator or
                        tff.learning.metrics.sum_then_finalize)
  with tf.Graph().as_default():
    model = model_fn()
    metrics_aggregation_fn = metrics_aggregator(model.metric_finalizers())
    data_type = tff.SequenceType(tff.types.tensorflow_to_type(
        model.input_spec))
    weights_type = tff.learning.models.weights_type_from_model(model)
  work_input_type = tff.StructWithPythonType(
      [('model_weights', weights_type), ('client_state', client_state_type)],
      StatefulClientWorkInput)

  @tff.tensorflow.computation(work_input_type, data_type,
                              work_state.round_context.type_signature.result)
  def client_update_computation(work_input, data, context):
    model = model_fn()

    @tf.function
    def client_update(work_input, data, context):
      tf.nest.map_structure(
          lambda variable, value: variable.assign(value),
          tff.learning.models.ModelWeights.from_model(model),
          work_input.model_weights)
      client_result, summed_values = client_update_fn(
          model, work_input, data, context)
      return (client_result, model.report_local_unfinalized_metrics(),
              summed_values)

    return client_update(work_input, data, context)

  update_state_fn = work_state.build_update(
      client_update_computation.type_signature.result[2])

  @tff.federated_computation
  def init_fn():
    return tff.federated_eval(work_state.initial, tff.SERVER)

  @tff.federated_computation(init_fn.type_signature.result,
                             tff.FederatedType(work_input_type, tff.CLIENTS),
                             tff.FederatedType(data_type, tff.CLIENTS))
  def next_fn(state, work_input, data):
    context = tff.federated_broadcast(
        tff.federated_map(work_state.round_context, state))
    client_result, model_outputs, summed_values = tff.federated_map(
        client_update_computation, (work_input, data, context))
    new_state = tff.federated_map(
        update_state_fn, (state, tff.federated_sum(summed_values)))
    measurements = tff.federated_zip(collections.OrderedDict(
        train=metrics_aggregation_fn(model_outputs)))
    return tff.templates.MeasuredProcessOutput(new_state, client_result,
                                               measurements)

  return tff.learning.templates.ClientWorkProcess(init_fn, next_fn)


class CohortMean(NamedTuple):
  """An aggregate with the cohort's size `|P^t|` (FedDyn's server needs it)."""

  mean: Any
  cohort_size: Any


def build_cohort_mean_aggregator(
    factory: tff.aggregators.WeightedAggregationFactory,
    value_type: tff.Type) -> tff.templates.AggregationProcess:
  """`factory`'s weighted mean as a `CohortMean` with the number of clients
  (each counted, whatever its weight); state and measurements `factory`'s."""
  inner = factory.create(value_type, tff.TensorType(np.float32))

  @tff.tensorflow.computation(np.float32)
  def one(_):
    return tf.constant(1.0, tf.float32)

  @tff.federated_computation(inner.next.type_signature.parameter)
  def next_fn(state, value, weight):
    output = inner.next(state, value, weight)
    cohort_size = tff.federated_sum(tff.federated_map(one, weight))
    return tff.templates.MeasuredProcessOutput(
        output.state, tff.federated_zip(CohortMean(output.result,
                                                   cohort_size)),
        output.measurements)

  return tff.templates.AggregationProcess(inner.initialize, next_fn)


class StatefulAlgorithm(NamedTuple):
  """What AdaBest, FedDyn and SCAFFOLD each define, composed per client by
  `compose_algorithm` or on shards by `fl_engine.fused_stateful.compose_fused`.

  Attributes:
    steps: The client (`StatefulClientSteps`).
    initial_client_state: `( -> C)`: a client new to training.
    initial_server_values_fn, broadcast_values_fn, server_values_update_fn:
      The client work's server values (`build_stateful_client_work`).
    finalizer: Takes the mean pseudo-gradient, or with `cohort_mean` a
      `CohortMean(mean, |P^t|)`.
    cohort_mean: Whether the finalizer needs the cohort's size.
    deployed_model_weights_fn, with_deployed_model_weights_fn: As in
      `compose_stateful_learning_process`.
  """

  steps: StatefulClientSteps
  initial_client_state: tff.Computation
  initial_server_values_fn: Callable[[], Any]
  broadcast_values_fn: Callable[[Any], Any]
  server_values_update_fn: Callable[[Any, Any], Any]
  finalizer: tff.learning.templates.FinalizerProcess
  cohort_mean: bool = False
  deployed_model_weights_fn: Optional[Callable[[Any], Any]] = None
  with_deployed_model_weights_fn: Optional[Callable[[Any, Any], Any]] = None


def compose_algorithm(
    model_fn: Callable[[], tff.learning.models.VariableModel],
    algorithm: StatefulAlgorithm,
    *,
    client_learning_rate: float,
    client_learning_rate_decay: float,
    model_aggregator: Optional[tff.aggregators.WeightedAggregationFactory],
    metrics_aggregator: Optional[Callable[..., tff.Computation]] = None,
) -> StatefulClientLearningProcess:
  """`algorithm` with one TFF client per real client (see
  `compose_stateful_learning_process`); `model_aggregator` defaults to
  `tff.aggregators.MeanFactory()`."""
  model_aggregator = model_aggregator or tff.aggregators.MeanFactory()
  weights_type = model_weights_type(model_fn)
  trainable_type = weights_type.trainable
  client_work = build_stateful_client_work(
      model_fn,
      client_state_type=algorithm.initial_client_state.type_signature.result,
      client_update_fn=client_update_from_steps(algorithm.steps),
      initial_server_values_fn=algorithm.initial_server_values_fn,
      broadcast_values_fn=algorithm.broadcast_values_fn,
      server_values_update_fn=algorithm.server_values_update_fn,
      client_learning_rate=client_learning_rate,
      client_learning_rate_decay=client_learning_rate_decay,
      metrics_aggregator=metrics_aggregator,
  )
  aggregator = (build_cohort_mean_aggregator(model_aggregator, trainable_type)
                if algorithm.cohort_mean else
                model_aggregator.create(trainable_type,
                                        tff.TensorType(np.float32)))
  return compose_stateful_learning_process(
      build_initial_model_weights_fn(model_fn),
      tff.learning.templates.build_broadcast_process(weights_type),
      client_work,
      aggregator,
      algorithm.finalizer,
      algorithm.initial_client_state,
      deployed_model_weights_fn=algorithm.deployed_model_weights_fn,
      with_deployed_model_weights_fn=(
          algorithm.with_deployed_model_weights_fn),
  )


def model_delta(initial_weights: Any,
                model: tff.learning.models.VariableModel) -> list[tf.Tensor]:
  """TFF's model delta `x − θ` (initial minus trained trainable weights).

  In Varno et al. (2022) this is the client pseudo-gradient `g_i = x^{t−1} −
  θ_i^{t,K}` (Definition 1).
  """
  trained = tf.nest.flatten(
      tff.learning.models.ModelWeights.from_model(model).trainable)
  return [x - theta for x, theta in zip(tf.nest.flatten(initial_weights),
                                        trained)]


def check_client_weighting(
    client_weighting: tff.learning.ClientWeighting) -> None:
  """Raises ValueError unless `client_weighting` is a `ClientWeighting`."""
  if not isinstance(client_weighting, tff.learning.ClientWeighting):
    raise ValueError(
        'client_weighting must be a tff.learning.ClientWeighting, found '
        f'{client_weighting!r}.')


def client_weight(client_weighting: tff.learning.ClientWeighting,
                  num_examples: tf.Tensor) -> tf.Tensor:
  """The aggregation weight of a client's update, as in TFF's FedAvg."""
  if client_weighting is tff.learning.ClientWeighting.NUM_EXAMPLES:
    return tf.cast(num_examples, tf.float32)
  return tf.constant(1.0, tf.float32)


class LocalTrainingResult(NamedTuple):
  """What `local_sgd_with_correction` reports besides the trained weights."""

  num_examples: tf.Tensor  # int64
  num_steps: tf.Tensor  # int64: K, the number of SGD steps taken


def local_sgd_with_correction(
    model: tff.learning.models.VariableModel,
    data: tf.data.Dataset,
    learning_rate: tf.Tensor,
    gradient_correction: Callable[[list[tf.Tensor], list[tf.Variable]],
                                  list[tf.Tensor]],
) -> LocalTrainingResult:
  """Runs one SGD step per batch of `data` on a corrected gradient.

  Each step is `θ ← θ − η·correction(∇L_i(θ), θ)` with TFF's SGD optimizer
  (`tff.learning.optimizers.build_sgdm(η)`), where `∇L_i` is the gradient of
  the model's batch loss, which for Keras models includes the layers'
  regularization losses (the task's weight decay). Trains `model`'s
  variables in place, from whatever weights they hold, and updates its
  metrics. Must run inside a `tf.function`.

  Args:
    model: The model to train.
    data: The client's batches.
    learning_rate: The step size `η`.
    gradient_correction: `(gradients, trainable_variables) -> gradients`,
      each a list matching `model.trainable_variables`: the algorithm's
      correction of the local gradient (Varno et al. 2022, Algorithm 1).

  Returns:
    The number of examples and of steps processed.
  """
  initial_loop_state, step = corrected_sgd(model, learning_rate,
                                           gradient_correction)
  # An iterator loop, not `dataset.reduce`, as in FedOpt's client work
  # (`large_cohort/fedopt.py`): the step then sits in the main graph instead
  # of a tf.data function the worker re-instantiates for every client.
  training_loop = tff.learning.loop_builder.build_training_loop(
      tff.learning.LoopImplementation.DATASET_ITERATOR)
  num_examples, num_steps, _ = training_loop(step, data, initial_loop_state)
  return LocalTrainingResult(num_examples, num_steps)


def corrected_sgd(
    model: tff.learning.models.VariableModel,
    learning_rate: tf.Tensor,
    gradient_correction: Callable[[list[tf.Tensor], list[tf.Variable]],
                                  list[tf.Tensor]],
) -> tuple[Callable[[], Any], Callable[[Any, Any], Any]]:
  """`(initial_loop_state_fn, step)` of `local_sgd_with_correction`.

  `step(loop_state, batch) -> loop_state` is one SGD step on the corrected
  gradient of `batch`; the loop state is `(num_examples, num_steps,
  optimizer_state)`. The per-client client work runs it over a dataset,
  `fl_engine.fused_stateful` over a shard's batches.
  """
  trainable = tf.nest.flatten(
      tff.learning.models.ModelWeights.from_model(model).trainable)
  optimizer = tff.learning.optimizers.build_sgdm(learning_rate=learning_rate)
  specs = tuple(tf.TensorSpec(v.shape, v.dtype) for v in trainable)

  def initial_loop_state():
    return (tf.constant(0, tf.int64), tf.constant(0, tf.int64),
            optimizer.initialize(specs))

  def step(loop_state, batch):
    num_examples, num_steps, optimizer_state = loop_state
    with tf.GradientTape() as tape:
      output = model.forward_pass(batch, training=True)
    gradients = [
        tf.zeros_like(v) if g is None else g
        for g, v in zip(tape.gradient(output.loss, trainable), trainable)
    ]
    optimizer_state, new_weights = optimizer.next(
        optimizer_state, tuple(trainable),
        tuple(gradient_correction(gradients, trainable)))
    if output.num_examples is None:
      batch_size = tf.shape(output.predictions, out_type=tf.int64)[0]
    else:
      batch_size = tf.cast(output.num_examples, tf.int64)
    with tf.control_dependencies([
        variable.assign(value)
        for variable, value in zip(trainable, new_weights)]):
      return (num_examples + batch_size, num_steps + 1,
              tf.nest.map_structure(tf.identity, optimizer_state))

  return initial_loop_state, step


def guarded_client_result(
    model_update: Any, weight: tf.Tensor, new_client_state: Any,
    old_client_state: Any) -> tff.learning.templates.ClientResult:
  """The client's `ClientResult`, discarding non-finite work.

  As TFF's FedAvg zeroes a non-finite model delta and gives it weight 0, a
  client whose update or new state has a NaN or Inf sends a zero update with
  weight 0 and keeps its old state.
  """
  finite = tf.reduce_all([
      tf.reduce_all(tf.math.is_finite(t))
      for t in tf.nest.flatten((model_update, new_client_state))
      if t.dtype.is_floating
  ])
  kept_state = tf.nest.map_structure(
      lambda new, old: tf.where(finite, new, old), new_client_state,
      old_client_state)
  return tff.learning.templates.ClientResult(
      update=StatefulClientUpdate(
          tf.nest.map_structure(
              lambda u: tf.where(finite, u, tf.zeros_like(u)), model_update),
          kept_state),
      update_weight=tf.where(finite, weight, 0.0))


def decayed_learning_rate(initial_learning_rate: float, decay: float,
                          round_num: tf.Tensor) -> tf.Tensor:
  """`η_t = η_0 · decay^(t−1)` for the 1-based round `t` (Varno et al. §4.1)."""
  return initial_learning_rate * tf.pow(
      tf.constant(decay, tf.float32), tf.cast(round_num - 1, tf.float32))


def check_population_size(population_size: int) -> None:
  """Raises ValueError unless `population_size` (`|S|`) is a positive int."""
  if not isinstance(population_size, int) or population_size < 1:
    raise ValueError('population_size must be a positive int, found '
                     f'{population_size!r}.')


def check_learning_rate_args(client_learning_rate: float,
                             client_learning_rate_decay: float) -> None:
  """Raises ValueError for a non-positive rate or a decay outside (0, 1]."""
  if not 0.0 < client_learning_rate < math.inf:
    raise ValueError('client_learning_rate must be finite and positive, found '
                     f'{client_learning_rate}.')
  if not 0.0 < client_learning_rate_decay <= 1.0:
    raise ValueError('client_learning_rate_decay must be in (0, 1], found '
                     f'{client_learning_rate_decay}.')


def run_round(
    process: StatefulClientLearningProcess,
    server_state: Any,
    client_ids: Sequence[str],
    client_datasets: Sequence[tf.data.Dataset],
    store: client_state_store.ClientStateStore,
    round_num: int,
) -> tff.learning.templates.LearningProcessOutput:
  """Runs one round of a stateful process with client states from `store`.

  Loads the cohort's states (fresh states for clients never seen), runs
  `process.next`, and saves the returned states as those of `round_num`.

  Args:
    process: The stateful learning process.
    server_state: The server state before the round.
    client_ids: The cohort.
    client_datasets: One dataset per client, in the order of `client_ids`;
      for a process `on_shards`, shards of those clients in that order.
    store: Where the client states live between rounds.
    round_num: The 1-based round number, the version the states are saved as.

  Returns:
    The new server state and the round's metrics.

  Raises:
    ValueError: If `client_ids` and the clients of `client_datasets` differ
      in number or the cohort is empty.
  """
  if process.on_shards:
    sizes = [shards.num_clients(shard) for shard in client_datasets]
  else:
    sizes = [1] * len(client_datasets)
  if sum(sizes) != len(client_ids) or not client_ids:
    raise ValueError(
        f'Expected one client per id for a non-empty cohort, found '
        f'{len(client_ids)} client ids and {sum(sizes)} clients in '
        f'{len(client_datasets)} datasets.')
  client_states = store.load(client_ids)
  if process.on_shards:
    bounds = np.cumsum([0] + sizes)
    client_states = [
        tf.nest.map_structure(lambda *leaves: np.stack(leaves),
                              *client_states[start:end])
        for start, end in zip(bounds[:-1], bounds[1:])]
  output = process.next(server_state, [
      StatefulClientInput(data, state)
      for data, state in zip(client_datasets, client_states)
  ])
  new_states = output.client_states
  if process.on_shards:
    new_states = [
        tf.nest.map_structure(lambda leaf, k=k: leaf[k], stacked)
        for stacked, size in zip(new_states, sizes) for k in range(size)]
  store.save(client_ids, new_states, round_num)
  return tff.learning.templates.LearningProcessOutput(output.state,
                                                      output.metrics)


def model_weights_type(
    model_fn: Callable[[], tff.learning.models.VariableModel]) -> tff.Type:
  """The TFF type of the `ModelWeights` of `model_fn`'s model."""
  with tf.Graph().as_default():
    return tff.learning.models.weights_type_from_model(model_fn())


def build_initial_model_weights_fn(
    model_fn: Callable[[], tff.learning.models.VariableModel]
) -> tff.Computation:
  """A no-arg computation: the `ModelWeights` of a new `model_fn()` model."""

  @tff.tensorflow.computation
  def initial_model_weights_fn():
    return tff.learning.models.ModelWeights.from_model(model_fn())

  return initial_model_weights_fn


def zeros_of_type(type_spec: tff.Type) -> Any:
  """Zero tensors with the structure, shapes and dtypes of `type_spec`."""
  return tf.nest.map_structure(lambda spec: tf.zeros(spec.shape, spec.dtype),
                               tff.types.type_to_tf_tensor_specs(type_spec))
