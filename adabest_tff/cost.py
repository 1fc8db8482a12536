"""The elementwise arithmetic of AdaBest, FedDyn, SCAFFOLD and FedAvg, counted.

Varno et al. (2022, Supplementary Tables 4-5) compare the algorithms' compute
by counting, per model parameter, the additions (`s`) and multiplications
(`m`) of each update rule (their Algorithm 2): the per-step correction of the
local gradient (`K` times a round), the client's state update after its last
step, and the server's update after the cohort's mean. This module takes the
same count from the package's own code: each phase's function, the one the
learning processes run (`*_algorithm` in this package), is traced into a
TensorFlow graph on float32 tensors shaped like the model, and every
arithmetic op of the phase is counted with its output's elements (an `AddN`
of `k` tensors as `k − 1` additions). Divided by the number of parameters
`n`, the counts are the tables' coefficients of `ns` and `nm`.

What is left out, as the paper leaves it out: the mini-batch gradient `g`,
the cohort's mean (`|P|ns`, the same for all), the model delta `x − θ_K`
every TFF client sends (FedAvg's too), and what is not arithmetic on the
model: the guards that drop a non-finite update (`tf.where`), the norms
reported as metrics and AdaBest's optional β decay.
"""

import collections
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from adabest_tff import adabest
from adabest_tff import feddyn
from adabest_tff import scaffold
from fl_engine import stateful_process

ALGORITHMS = ('fedavg', 'adabest', 'feddyn', 'scaffold')
# One local step (the correction and the SGD step), the client's conclusion
# after its last step, and the server's update after the cohort's mean.
PHASES = ('local_step', 'client_conclusion', 'server_update')
_ADDITIONS = frozenset({'Add', 'AddV2', 'Sub', 'Neg'})
_MULTIPLICATIONS = frozenset({'Mul', 'RealDiv', 'Div', 'DivNoNan'})
# Round number, client examples and steps the traced functions see; they
# enter only scalar arithmetic, which is O(1) per phase and left in the
# counts (a few parameters' worth out of n).
_ROUND, _EXAMPLES, _STEPS = 2, 45, 1


def count_arithmetic(make_inputs: Callable[[], Any],
                     phase: Callable[..., Any]) -> tuple[int, int]:
  """`(additions, multiplications)` of `phase(*make_inputs())`, elementwise.

  Both are traced into one new graph; only the ops `phase` adds are counted,
  so `make_inputs` may compute what the phase starts from (a client's `aux`,
  say) without it being counted.
  """
  added = []

  # A `tf.function`'s graph, whose automatic control dependencies use every
  # op (a bare graph would warn of an unused assertion).
  @tf.function(autograph=False)
  def trace():
    graph = tf.compat.v1.get_default_graph()
    inputs = make_inputs()
    before = set(graph.get_operations())
    phase(*inputs)
    added.extend(op for op in graph.get_operations() if op not in before)

  trace.get_concrete_function()
  additions = multiplications = 0
  for op in added:
    if not op.outputs or not op.outputs[0].dtype.is_floating:
      continue
    elements = op.outputs[0].shape.num_elements()
    if elements is None:
      raise ValueError(f'{op.name} ({op.type}) has no static shape')
    if op.type in _ADDITIONS:
      additions += elements
    elif op.type == 'AddN':
      additions += elements * (len(op.inputs) - 1)
    elif op.type in _MULTIPLICATIONS:
      multiplications += elements
  return additions, multiplications


def _algorithm(name: str, weights_type: tff.Type
               ) -> stateful_process.StatefulAlgorithm:
  population = 100
  if name == 'adabest':
    return adabest.adabest_algorithm(weights_type)
  if name == 'feddyn':
    return feddyn.feddyn_algorithm(weights_type, population_size=population)
  return scaffold.scaffold_algorithm(weights_type, population_size=population)


def _zeros(shapes: Sequence[Sequence[int]]) -> list[tf.Tensor]:
  return [tf.zeros(shape, tf.float32) for shape in shapes]


def _client_phases(algorithm: stateful_process.StatefulAlgorithm,
                   shapes: Sequence[Sequence[int]]
                   ) -> dict[str, tuple[Callable[[], Any], Callable[..., Any]]]:
  steps = algorithm.steps
  sgd = tff.learning.optimizers.build_sgdm(learning_rate=0.1)

  def client_inputs():
    context = stateful_process.RoundContext(
        tf.constant(_ROUND), tf.constant(0.1),
        algorithm.broadcast_values_fn(algorithm.initial_server_values_fn()))
    client_state = stateful_process.zeros_of_type(
        algorithm.initial_client_state.type_signature.result)
    aux = steps.prepare(client_state, _zeros(shapes), context,
                        lambda: tf.constant(_EXAMPLES, tf.int64))
    return client_state, aux, context

  def step_inputs():
    _, aux, _ = client_inputs()
    trainable = _zeros(shapes)
    specs = tuple(tf.TensorSpec(s, tf.float32) for s in shapes)
    return aux, _zeros(shapes), trainable, sgd.initialize(specs)

  def local_step(aux, gradients, trainable, sgd_state):
    corrected = steps.correction(aux, gradients, trainable)
    return sgd.next(sgd_state, tuple(trainable), tuple(corrected))

  def conclusion_inputs():
    client_state, aux, context = client_inputs()
    training = stateful_process.LocalTrainingResult(
        tf.constant(_EXAMPLES, tf.int64), tf.constant(_STEPS, tf.int64))
    return client_state, aux, _zeros(shapes), training, context

  return {'local_step': (step_inputs, local_step),
          'client_conclusion': (conclusion_inputs, steps.conclude)}


def _server_phase(name: str, algorithm, shapes: Sequence[Sequence[int]]
                  ) -> tuple[Callable[[], Any], Callable[..., Any]]:
  """The server's rule after the cohort's mean `ḡ`: the function each
  process's finalizer (and SCAFFOLD's client work, for `c`) applies."""
  specs = tuple(tf.TensorSpec(s, tf.float32) for s in shapes)
  # FedAvg and SCAFFOLD: `x − η_g·ḡ`, TFF's SGD (server learning rate 1).
  sgd = tff.learning.optimizers.build_sgdm(learning_rate=1.0)

  def inputs():
    return _zeros(shapes), _zeros(shapes), _zeros(shapes)

  if name == 'adabest':
    return inputs, lambda h, x, g: adabest.adabest_server_update(
        h, x, g, tf.constant(0.96))
  if name == 'feddyn':
    return inputs, lambda h, x, g: feddyn.feddyn_server_update(
        h, x, g, tf.constant(0.1))
  if name == 'fedavg':
    return inputs, lambda _, x, g: sgd.next(sgd.initialize(specs), tuple(x),
                                            tuple(g))

  def scaffold_server(c, x, g):
    # The model's step, then `c ← c + Σ(c_i⁺ − c_i)/|S|` (`c` is a server
    # value of SCAFFOLD's client work, updated from the clients' sum).
    sgd.next(sgd.initialize(specs), tuple(x), tuple(g))
    algorithm.server_values_update_fn(
        collections.OrderedDict([(scaffold.CONTROL_VARIATE, c)]),
        collections.OrderedDict([(scaffold.CONTROL_VARIATE_DELTA,
                                  _zeros(shapes))]))

  return inputs, scaffold_server


def count_costs(shapes: Sequence[Sequence[int]]
                ) -> list[collections.OrderedDict]:
  """Each algorithm's additions and multiplications per phase, per parameter.

  Args:
    shapes: The shapes of the model's trainable variables.

  Returns:
    One row per algorithm and phase (`ALGORITHMS` x `PHASES`): `algorithm`,
    `phase`, `parameters` (n), `additions` and `multiplications` (each
    divided by n). FedAvg's local step is TFF's SGD step alone; its client
    has no conclusion (0).
  """
  trainable = [tff.TensorType(np.float32, s) for s in shapes]
  weights_type = tff.StructWithPythonType(
      [('trainable', tff.StructWithPythonType(trainable, list)),
       ('non_trainable', tff.StructWithPythonType([], list))],
      tff.learning.models.ModelWeights)
  n = sum(int(tf.TensorShape(s).num_elements()) for s in shapes)
  sgd = tff.learning.optimizers.build_sgdm(learning_rate=0.1)
  specs = tuple(tf.TensorSpec(s, tf.float32) for s in shapes)
  rows = []
  for name in ALGORITHMS:
    if name == 'fedavg':
      algorithm = None
      phases = {
          'local_step': (
              lambda: (_zeros(shapes), _zeros(shapes), sgd.initialize(specs)),
              lambda x, g, state: sgd.next(state, tuple(x), tuple(g))),
          'client_conclusion': (lambda: (), lambda: None),
      }
    else:
      algorithm = _algorithm(name, weights_type)
      phases = _client_phases(algorithm, shapes)
    phases['server_update'] = _server_phase(name, algorithm, shapes)
    for phase in PHASES:
      additions, multiplications = count_arithmetic(*phases[phase])
      rows.append(collections.OrderedDict([
          ('algorithm', name), ('phase', phase), ('parameters', n),
          ('additions', additions / n),
          ('multiplications', multiplications / n)]))
  return rows


def count_model_costs(model_fn: Callable[[], tff.learning.models.VariableModel]
                      ) -> list[collections.OrderedDict]:
  """`count_costs` for the trainable variables of `model_fn()`'s model."""
  return count_costs([tuple(v.shape)
                      for v in model_fn().trainable_variables])
