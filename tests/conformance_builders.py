"""Every public builder of the three papers, and a run of it round by round.

Not a test module: `test_builders_conformance` (one conformance suite over
every builder) and `fl_engine/runtime/test_in_process` (each builder on both runtimes) import
it.
"""

import collections
import contextlib
import importlib
import inspect
from unittest import mock

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

import adabest_tff
from fl_engine import stateful_process
from fl_common import diagnosed_mean
from fl_engine import execution
from fl_engine import shards
import gel_tff
import large_cohort
from tests import fused_checks
from tests import repo_layout
from tests import tiny_models

_SHARDS = execution.OnShards()

NUM_FEATURES = 3
CLIENT_SIZES = {'a': 3, 'b': 5, 'c': 8}
POPULATION = len(CLIENT_SIZES) + 1


def _sgd(rate):
  return tff.learning.optimizers.build_sgdm(rate)


BUILDERS = {
    'fedopt': lambda m: large_cohort.build_fedopt(
        m, client_optimizer=_sgd(0.1), server_optimizer=_sgd(1.0)),
    'fedopt_lamb': lambda m: large_cohort.build_fedopt(
        m, client_optimizer=_sgd(0.1),
        server_optimizer=large_cohort.build_lamb(0.01)),
    'fedopt_uniform': lambda m: large_cohort.build_fedopt(
        m, client_optimizer=_sgd(0.1), server_optimizer=_sgd(1.0),
        client_weighting=tff.learning.ClientWeighting.UNIFORM),
    # Its client data are shards of clients (`Run.round` makes them).
    'fused_fedopt': lambda m: fused_checks.on_shards(
        large_cohort.build_fedopt, m, client_optimizer=_sgd(0.1), server_optimizer=_sgd(1.0),
        model_aggregator=diagnosed_mean.diagnosed_mean_factory()),
    'fedsgd': lambda m: large_cohort.build_fedsgd(
        m, server_optimizer=_sgd(0.1)),
    'fused_fedsgd': lambda m: fused_checks.on_shards(
        large_cohort.build_fedsgd, m, server_optimizer=_sgd(0.1),
        model_aggregator=diagnosed_mean.diagnosed_mean_factory()),
    'normalized_fed_avg': lambda m: large_cohort.build_normalized_fed_avg(
        m, client_optimizer=_sgd(0.1), server_learning_rate=0.1),
    'adabest': lambda m: adabest_tff.build_adabest(m),
    'feddyn': lambda m: adabest_tff.build_feddyn(
        m, population_size=POPULATION),
    'scaffold': lambda m: adabest_tff.build_scaffold(
        m, population_size=POPULATION),
    'fused_adabest': lambda m: adabest_tff.build_adabest(m, execution=_SHARDS),
    'fused_feddyn': lambda m: adabest_tff.build_feddyn(
        m, population_size=POPULATION, execution=_SHARDS),
    'fused_scaffold': lambda m: adabest_tff.build_scaffold(
        m, population_size=POPULATION, execution=_SHARDS),
    **{f'{base}_gel': (lambda m, base=base: gel_tff.build_gel(
        m, base=base, client_learning_rate=0.05, expected_steps=6))
       for base in gel_tff.BASES},
    **{f'{base}_budgeted': (lambda m, base=base: gel_tff.build_budgeted_baseline(
        m, base=base, client_learning_rate=0.05)) for base in gel_tff.BASES},
    'fused_fednova_gel': lambda m: fused_checks.on_shards(
        gel_tff.build_gel, m, base='fednova', client_learning_rate=0.05, expected_steps=6,
        model_aggregator=diagnosed_mean.diagnosed_mean_factory()),
    'fused_fedprox_budgeted': lambda m: fused_checks.on_shards(
        gel_tff.build_budgeted_baseline, m, base='fedprox', client_learning_rate=0.05,
        model_aggregator=diagnosed_mean.diagnosed_mean_factory()),
}



class _Called(Exception):
  """Raised by a stand-in builder: which builder an entry calls."""


def process_builders() -> dict[str, object]:
  """Every public `build_<name>(model_fn, ...)` of the paper packages
  (`repo_layout.paper_packages`), as `'<package>.build_<name>'` -> it."""
  found = {}
  for package in repo_layout.paper_packages():
    module = importlib.import_module(package)
    for name in getattr(module, '__all__', dir(module)):
      builder = getattr(module, name)
      if name.startswith('build_') and callable(builder):
        parameters = list(inspect.signature(builder).parameters)
        if parameters[:1] == ['model_fn']:
          found[f'{package}.{name}'] = builder
  return found


def _called_by(entry) -> set[str]:
  """The public builders `entry` calls (each replaced by a stand-in that
  records its name and stops the call)."""
  called = set()
  with contextlib.ExitStack() as stack:
    for key in process_builders():
      package, name = key.split('.')

      def stand_in(*args, key=key, **kwargs):
        del args, kwargs
        called.add(key)
        raise _Called()

      stack.enter_context(mock.patch.object(
          importlib.import_module(package), name, stand_in))
    try:
      entry(None)
    except _Called:
      pass
  return called


def _needs_arguments(builder) -> bool:
  # `**kwargs` passed on to another builder may hold required ones.
  parameters = list(inspect.signature(builder).parameters.values())[1:]
  return any(p.kind == p.VAR_KEYWORD or (
      p.default is inspect.Parameter.empty and p.kind != p.VAR_POSITIONAL)
             for p in parameters)


def _with_every_builder(explicit):
  """`explicit`, plus `build_<name>(model_fn)` with its defaults for each
  public builder no entry calls (a new family's, a new paper's): every
  builder is in the suite without a test edit. One that needs arguments
  is left out and named by `uncovered_builders`."""
  entries = dict(explicit)
  for key, builder in process_builders().items():
    if key not in _COVERED and not _needs_arguments(builder):
      entries[key.split('.')[1][len('build_'):]] = (
          lambda m, builder=builder: builder(m))
  return entries


def uncovered_builders() -> list[str]:
  """The public builders neither an entry of `BUILDERS` calls nor
  `_with_every_builder` could add (they need arguments)."""
  return sorted(key for key, builder in process_builders().items()
                if key not in _COVERED and _needs_arguments(builder))


# The builders the entries above call.
_COVERED = set().union(*(_called_by(e) for e in BUILDERS.values()))
BUILDERS = _with_every_builder(BUILDERS)


def _unclipped_mean():
  return diagnosed_mean.diagnosed_mean_factory(clipping=False)


# Each fused builder's per-client twin: the same algorithm with the same
# arguments, one TFF client per client (`test_builders_conformance`: their
# rounds are equal).
PER_CLIENT_TWINS = {
    'fused_fedopt': lambda m: large_cohort.build_fedopt(
        m, client_optimizer=_sgd(0.1), server_optimizer=_sgd(1.0),
        model_aggregator=diagnosed_mean.diagnosed_mean_factory()),
    'fused_fedsgd': lambda m: large_cohort.build_fedsgd(
        m, server_optimizer=_sgd(0.1),
        model_aggregator=diagnosed_mean.diagnosed_mean_factory()),
    # On shards, the stateful families' default aggregator is the
    # diagnosed mean without clipping; per client, TFF's mean.
    'fused_adabest': lambda m: adabest_tff.build_adabest(
        m, model_aggregator=_unclipped_mean()),
    'fused_feddyn': lambda m: adabest_tff.build_feddyn(
        m, population_size=POPULATION, model_aggregator=_unclipped_mean()),
    'fused_scaffold': lambda m: adabest_tff.build_scaffold(
        m, population_size=POPULATION, model_aggregator=_unclipped_mean()),
    'fused_fednova_gel': lambda m: gel_tff.build_gel(
        m, base='fednova', client_learning_rate=0.05, expected_steps=6,
        model_aggregator=diagnosed_mean.diagnosed_mean_factory()),
    'fused_fedprox_budgeted': lambda m: gel_tff.build_budgeted_baseline(
        m, base='fedprox', client_learning_rate=0.05,
        model_aggregator=diagnosed_mean.diagnosed_mean_factory()),
}


def _dataset(client_id, nan=False):
  rng = np.random.default_rng(sorted(CLIENT_SIZES).index(client_id))
  n = CLIENT_SIZES[client_id]
  x = rng.normal(size=(n, NUM_FEATURES)).astype(np.float32)
  if nan:
    x[0, 0] = np.nan
  y = rng.normal(size=(n, 1)).astype(np.float32)
  return tf.data.Dataset.from_tensor_slices(
      collections.OrderedDict(x=x, y=y)).batch(2)


# Built processes by (builder name, seed, per-client twin). A process is a set
# of TFF computations, the same whichever runtime runs them and however
# often: building one (tracing every computation) is most of a two-round
# test, so the conformance tests and the runtime tests build each once.
_BUILT = {}


class Run:
  """A process trained round by round, stateful clients included."""

  def __init__(self, name, tmp_path, seed=0, per_client_twin=False,
               fresh=False):
    """`fresh` builds the process anew; otherwise a process built before
    with the same arguments in this test process is used again (`_BUILT`)."""
    tf.keras.utils.set_random_seed(seed)
    self.name = name
    self.on_shards = name.startswith('fused_') and not per_client_twin
    key = (name, seed, per_client_twin)
    if fresh or key not in _BUILT:
      builder = PER_CLIENT_TWINS[name] if per_client_twin else BUILDERS[name]
      _BUILT[key] = builder(tiny_models.linear_model_fn(NUM_FEATURES))
    self.process = _BUILT[key]
    self.runner = None
    if isinstance(self.process, stateful_process.StatefulClientLearningProcess):
      self.runner = adabest_tff.StatefulClientRunner(
          self.process, adabest_tff.ClientStateStore(
              str(tmp_path / f'{name}_{seed}_{id(self)}'),
              self.process.initial_client_state()))
    self.state = self.process.initialize()

  def round(self, client_ids, nan_client=None, round_num=None):
    datasets = [_dataset(c, nan=c == nan_client) for c in client_ids]
    if self.on_shards:
      datasets = shards.shards_from_datasets(datasets, 2)
    if self.runner is None:
      output = self.process.next(self.state, datasets)
    else:
      output = self.runner.next(self.state, client_ids, datasets, round_num)
    self.state = output.state
    return output.metrics

  def weights(self):
    return tiny_models.flat(self.process.get_model_weights(self.state).trainable)
