"""Every driver flag either changes the run or is refused (`flag_rules`).

For each algorithm and each flag of the driver, the flag is given on the
command line with a value other than its default (alone, and where its use
depends on another flag, also with that flag set). Then either
`check_flags` refuses it in one line naming it, or what the driver builds
differs from the run without it: the task's arguments, the loop's settings,
the runtime, the run directory, or the learning process itself, trained two
rounds on a small Synthetic task (model weights, metrics, the family's
per-round metrics and run summary).

Training is the test's cost (a build and two rounds a flag), so an
optimizer's learning rate and hyperparameters count as changing the run when
they change the arguments its optimizer is built with
(`optimizers.build_optimizer`): that each role's optimizer reaches the
process is proven by training with `--client_optimizer` and
`--server_optimizer` (`_TRAINED_ALWAYS`), and that each argument changes
the optimizer by the optimizers' own tests.
"""

import contextlib
import dataclasses
import itertools
import os

from absl import flags
from absl.testing import flagsaver
import numpy as np
import pandas as pd
import pytest
import tensorflow as tf

from fl_engine import client_state_store
from fl_engine import stateful_process
from experiment_driver import build
from experiment_driver import families
from experiment_driver import flag_groups as f
from experiment_driver import flag_rules
from experiment_driver import gel_setup
from experiment_driver import outputs
from fl_engine import runtime
from experiment_driver import tuned_defaults
from fl_common import optimizers
import tasks

FLAGS = flags.FLAGS
_BASELINE_DIR = '/tmp/fl_papers_flag_rules_baseline'
# A value other than the default for every flag, as typed on a command line.
NON_DEFAULT = {
    'data_dir': '/tmp/fl_papers_no_data', 'use_synthetic_data': 'true',
    'offline': 'true', 'progress': 'false',
    'clients_per_shard': '1', 'lanes': '2',
    'train_batch_size': '7', 'eval_batch_size': '17', 'client_epochs': '2',
    'max_elements_per_client': '9', 'validation_fraction': '0.3',
    'uniform_weighting': 'true', 'clipping': 'false',
    'zeroing': 'true', 'clients_per_round': '4', 'total_rounds': '7',
    'server_lr_scaling': 'sqrt', 'reference_cohort_size': '3',
    'server_warmup_rounds': '0', 'rounds_to_double_cohort': '2',
    'max_cohort_size': '15', 'normalize_server_update': 'true',
    'straggler_alpha': '2.0', 'straggler_lambda': '0.5',
    'rounds_per_eval': '3', 'max_eval_clients': '5', 'cohort_accuracy': 'true',
    'per_client_eval': 'false',
    'root_output_dir': '/tmp/fl_papers_elsewhere', 'experiment_name': 'other',
    'rounds_per_checkpoint': '3', 'checkpoints_to_keep': '5',
    'max_concurrent_clients': '1', 'runtime': 'worker', 'devices': 'CPU:0',
    'max_clients_per_call': '2', 'worker_addresses': 'localhost:1234',
    'seed': '5', 'adabest_mu': '0.5', 'adabest_beta': '0.5',
    'adabest_beta_decay_patience': '1', 'adabest_beta_decay_factor': '0.01',
    'client_lr_decay': '0.5', 'adabest_client_weighting': 'num_examples',
    'budget_min': '2', 'budget_max': '6', 'expected_steps': '30',
    'guessed_steps': 'infinite', 'proximal_strength': '0.5',
    'target_accuracy': '0.05', 'target_metric': 'validation/accuracy',
    'baseline_run_dir': _BASELINE_DIR,
    **{f'{role}_{name}': value for role in ('client', 'server')
       for name, value in (
           ('optimizer', 'adam'), ('learning_rate', '0.05'),
           *((name, '0.5' if spec.below_one else '0.1') for name, spec
             in optimizers.HYPERPARAMETERS_SPECS.items()))},
    # The tasks' own flags, each with its record's example.
    **{name: spec.example for name, spec in tasks.TASK_FLAGS.items()},
}
# Flags whose use depends on another: also tried with that one set.
CONTEXT = {
    # A hyperparameter: with the first optimizer of the registry taking it.
    **{f'{role}_{name}': {f'{role}_optimizer': next(
        optimizer for optimizer, entry in optimizers.OPTIMIZERS.items()
        if name in entry.hyperparameters)}
       for role in ('client', 'server')
       for name in optimizers.HYPERPARAMETERS_SPECS},
    'reference_cohort_size': {'server_lr_scaling': 'sqrt'},
    'max_concurrent_clients': {'runtime': 'worker'},
    'server_warmup_rounds': {'server_lr_scaling': 'sqrt'},
    'max_cohort_size': {'rounds_to_double_cohort': '2'},
    'straggler_alpha': {'straggler_lambda': '0.5'},
    'adabest_beta_decay_factor': {'adabest_beta_decay_patience': '1'},
    **{name: {spec.needs[0]: tasks.TASK_FLAGS[spec.needs[0]].example}
       for name, spec in tasks.TASK_FLAGS.items() if spec.needs},
}


def _one_algorithm_per_use_of_the_flags() -> tuple[str, ...]:
  """From the families' registry: one algorithm per distinct use of the
  flags (its family, the shared flags it honours, the own flags it uses),
  and one per GeL base (each base builds its own process), in registry
  order. A new family or algorithm is here without a test edit."""
  groups, base_of = {}, {}
  for name, family in families.FAMILY_OF.items():
    signature = (id(family), family.shared_flags[name], frozenset(
        flag for flag, users in family.own_flags.items() if name in users))
    groups.setdefault(signature, []).append(name)
    base_of[name] = (name.rsplit('_', 1)[0] if family is gel_setup.FAMILY
                     else name)
  chosen = []
  for names in groups.values():  # each use, by a base not yet covered
    covered = {base_of[n] for n in chosen}
    chosen.append(next((n for n in names if base_of[n] not in covered),
                       names[0]))
  for name in families.FAMILY_OF:  # then each base not yet covered
    if base_of[name] not in {base_of[n] for n in chosen}:
      chosen.append(name)
  return tuple(chosen)


ALGORITHMS = _one_algorithm_per_use_of_the_flags()
_AXES = ('task', 'algorithm')
_ROUNDS = 2
_STAGES = 1 + _ROUNDS  # what is built, then each round (`_process_stages`)
# Flags compared on the trained process even where what the driver builds
# around it already differs: the optimizer record of `_cheap_fingerprint`
# counts only once these prove that each role's optimizer is used.
_TRAINED_ALWAYS = frozenset({'client_optimizer', 'server_optimizer'})


@pytest.fixture(scope='module', autouse=True)
def parsed_flags():
  if not FLAGS.is_parsed():
    FLAGS.mark_as_parsed()
  os.makedirs(_BASELINE_DIR, exist_ok=True)
  _write_metrics(_BASELINE_DIR, accuracy=[0.01, 0.2, 0.9])


@pytest.fixture(scope='module')
def small_task():
  return tasks.create_task('synthetic', num_clients=30, seed=0)


def _write_metrics(run_dir, accuracy):
  rounds = len(accuracy)
  pd.DataFrame({
      'round': range(1, rounds + 1),
      # Each split reaches a target in another round.
      **{f'{split}/accuracy': [a / (1 + i) for a in accuracy]
         for i, split in enumerate(('test', 'validation', 'train'))},
      'gradient_computations': [10.0 + r for r in range(rounds)],
      'bytes_down': [100.0] * rounds, 'bytes_up': [90.0 + r
                                                  for r in range(rounds)],
  }).to_csv(os.path.join(run_dir, 'metrics.csv'), index=False)


def test_every_flag_has_a_non_default_value():
  assert set(flag_rules.driver_flags()) - set(_AXES) == set(NON_DEFAULT)
  for name, value in NON_DEFAULT.items():
    with flagsaver.flagsaver():
      FLAGS[name].parse(value)
      assert FLAGS[name].value != FLAGS[name].default, name


@contextlib.contextmanager
def _command_line(**given):
  """The flags as if typed on the command line: values set, marked present."""
  with flagsaver.flagsaver():
    for name, value in given.items():
      FLAGS[name].parse(value)
    yield


def _cheap_fingerprint(task, monkeypatch):
  """What the driver builds around the process: task arguments, loop,
  cohorts, straggler times, runtime, run directory, and the arguments of
  the optimizers it builds."""
  built_optimizers = []
  build_optimizer = optimizers.build_optimizer
  monkeypatch.setattr(
      optimizers, 'build_optimizer',
      lambda *args, **kwargs: built_optimizers.append(
          (args, sorted(kwargs.items()))) or build_optimizer(*args, **kwargs))
  build.build_context(task)
  monkeypatch.setattr(optimizers, 'build_optimizer', build_optimizer)
  task_kwargs = {}
  monkeypatch.setattr(tasks, 'create_task',
                      lambda name, **kwargs: task_kwargs.update(
                          kwargs, name=name) or task)
  build.create_task()
  runtimes = []
  for name in ('local_runtime', 'worker_runtime', 'remote_runtime'):
    monkeypatch.setattr(
        runtime, name,
        lambda *args, name=name, **kwargs: runtimes.append(
            (name, args, sorted(kwargs.items()))))
  build.runtime()
  config = build.loop_config(task)
  ids = sorted(task.datasets.train_data.client_ids)[:5]
  run_dir = build.run_directory()
  return repr((
      built_optimizers, sorted(task_kwargs.items()), runtimes, run_dir.path,
      run_dir.checkpoints_to_keep,
      [config.cohort_size_fn(r) for r in range(1, 65)],
      [fn(1, ids, {}) for fn in config.extra_metrics_fns],
      config.total_rounds, config.rounds_per_eval,
      config.rounds_per_checkpoint, config.max_eval_clients, config.seed,
      config.accuracy_name, config.cohort_accuracy, config.per_client_eval))


def _process_stages(task, tmp_path):
  """The learning process's fingerprint in `_STAGES` stages, each computed
  when asked for (so that a flag is told apart by the first that differs):
  what was built (how it executes, the family's run summary), then each of
  `_ROUNDS` rounds trained (metrics with the family's hooks; the last with
  the model weights). The flags must be those of the run at each step."""
  tmp_path.mkdir(parents=True)
  ctx = build.build_context(task)
  setup = build.build_algorithm(ctx)
  summary = None
  if setup.finish_fn:
    run_dir = tmp_path / 'run'
    run_dir.mkdir(exist_ok=True)
    _write_metrics(str(run_dir), accuracy=[0.01, 0.6, 0.95])
    summary = sorted(setup.finish_fn(str(run_dir)).items())
  yield repr((summary, setup.execution))
  process = setup.process
  ids = sorted(task.datasets.train_data.client_ids)[:ctx.clients_per_round]
  store = None
  if isinstance(process, stateful_process.StatefulClientLearningProcess):
    store = client_state_store.ClientStateStore(
        str(tmp_path / 'client_states'), process.initial_client_state())
  state = process.initialize()
  for round_num in range(1, _ROUNDS + 1):
    tf.random.set_seed(round_num)
    if setup.client_datasets_fn:
      datasets = setup.client_datasets_fn(round_num, ids)
    else:
      datasets = [task.datasets.train_preprocess_fn(
          task.datasets.train_data.create_tf_dataset_for_client(i))
                  for i in ids]
    if store is None:
      output = process.next(state, datasets)
    else:
      output = stateful_process.run_round(process, state, ids, datasets,
                                          store, round_num)
    state = output.state
    metrics = outputs.flatten_metrics(output.metrics)
    if setup.round_metrics_fn:
      metrics.update(setup.round_metrics_fn(round_num, ids, metrics))
    # How many TFF clients the round had (shards or single clients) too.
    seen = (len(datasets),
            sorted((k, round(float(v), 6)) for k, v in metrics.items()))
    if round_num == _ROUNDS:
      seen += ([np.round(np.asarray(w), 6).tolist()
                for w in process.get_model_weights(state).trainable],)
    yield repr(seen)


@pytest.mark.parametrize('algorithm', ALGORITHMS)
def test_each_flag_changes_the_run_or_is_refused(algorithm, small_task,
                                                 monkeypatch, tmp_path):
  cache, runs, last, dirs = {}, {}, [None], itertools.count()

  def stage(given, k):
    """Stage `k` of the process fingerprint, computed when first needed.

    A run's stages are computed in one stretch, as a run would be: one
    continued after another run's is made again from its start."""
    key = tuple(sorted(given.items()))
    done = runs[key][0] if key in runs else []
    if len(done) <= k and (not done or last[0] != key):
      runs[key] = ([], _process_stages(small_task, tmp_path / str(next(dirs))))
    done, stages = runs[key]
    while len(done) <= k:
      last[0] = key
      with _command_line(algorithm=algorithm, **given):
        done.append(next(stages))
    return done[k]

  def with_rates(given):
    """`given`, with learning rates where its optimizer has none tuned for
    the test's task (a missing tuned rate is refused: the user gives it)."""
    with _command_line(algorithm=algorithm, **given):
      try:
        flag_rules.effective_hparams(flag_rules.values_of(FLAGS))
        return given
      except tuned_defaults.MissingTunedRateError:
        pass
    honoured = families.FAMILY_OF[algorithm].shared_flags[algorithm]
    return {**{name: '0.07' for name in ('server_learning_rate',
                                          'client_learning_rate')
               if name in honoured}, **given}

  def fingerprints(given):
    given = with_rates(given)
    key = tuple(sorted(given.items()))
    if key not in cache:
      with _command_line(algorithm=algorithm, **given):
        try:
          flag_rules.check_flags()
        except flag_rules.UnusedFlagError as e:
          cache[key] = ('refused', str(e))
        else:
          cache[key] = (_cheap_fingerprint(small_task, monkeypatch),
                        lambda k: stage(given, k))
    return cache[key]

  silently_ignored = []
  for name, value in NON_DEFAULT.items():
    if name == 'clipping':  # its default depends on the algorithm
      value = str(not f.clipping_default(algorithm)).lower()
    for context in ({}, CONTEXT.get(name)):
      if context is None or name in context:
        continue
      with_flag = fingerprints({**context, name: value})
      if with_flag[0] == 'refused':
        assert f'--{name} ' in with_flag[1] and '\n' not in with_flag[1]
        continue
      without = fingerprints(context)
      assert without[0] != 'refused', (context, without)
      if with_flag[0] != without[0] and name not in _TRAINED_ALWAYS:
        continue
      # The run without it whole, then the run with it up to the first
      # stage that differs.
      base = [without[1](k) for k in range(_STAGES)]
      if all(with_flag[1](k) == base[k] for k in range(_STAGES)):
        silently_ignored.append((name, context))
  assert not silently_ignored, (
      f'--algorithm={algorithm}: flags accepted but without effect:'
      f' {silently_ignored}')


@pytest.mark.parametrize('task_name', tasks.TASK_NAMES)
def test_task_flags_reach_the_task_or_are_refused(task_name, monkeypatch):
  recorded = []
  monkeypatch.setattr(tasks, 'create_task',
                      lambda name, **kwargs: recorded.append(kwargs))
  task_flags = ('data_dir', 'use_synthetic_data', 'max_elements_per_client',
                'validation_fraction', 'train_batch_size', 'eval_batch_size',
                'client_epochs', *tasks.TASK_FLAGS)
  # A task without tuned rates (a new one) runs with its rates given.
  try:
    tuned_defaults.learning_rates(task_name, 'sgd')
    rates = {}
  except tuned_defaults.MissingTunedRateError:
    rates = {'server_learning_rate': '1.0', 'client_learning_rate': '0.1'}
  for name in task_flags:
    context = {**rates, **({'use_synthetic_data': 'false'} if name ==
                           'data_dir' else CONTEXT.get(name, {}))}
    with _command_line(task=task_name, **context):
      build.create_task()
    for given in ({name: NON_DEFAULT[name]},):
      with _command_line(task=task_name, **context, **given):
        try:
          flag_rules.check_flags()
        except flag_rules.UnusedFlagError as e:
          assert f'--{name} ' in str(e)
          continue
        build.create_task()
      assert recorded[-1] != recorded[-2], (task_name, name)


def test_refusal_is_one_line_naming_each_flag_and_why():
  with _command_line(algorithm='adabest', task='synthetic_partitioned',
                     server_optimizer='adam', server_lr_scaling='linear'):
    with pytest.raises(flag_rules.UnusedFlagError) as raised:
      flag_rules.check_flags()
  message = str(raised.value)
  assert '\n' not in message
  assert '--server_optimizer is not used by --algorithm=adabest' in message
  assert '--server_lr_scaling is not used by --algorithm=adabest' in message


def test_a_default_value_given_explicitly_is_refused_too():
  # As in the large-cohort code: giving the flag at all is the mistake.
  with _command_line(algorithm='fedopt', server_optimizer='sgd',
                     server_momentum='0.9'):
    with pytest.raises(flag_rules.UnusedFlagError, match='server_momentum'):
      flag_rules.check_flags()


@pytest.mark.parametrize('algorithm, given, clipping', [
    ('fedavgcm_gel', {}, False),  # GeL's paper clips nothing
    ('fednova_budgeted', {}, False),
    ('fedavgcm_gel', {'clipping': 'true'}, True),
    ('fedopt', {}, True),  # the large-cohort paper clips after Section 3.1
    ('fedopt', {'clipping': 'false'}, False),
])
def test_clipping_defaults_per_family_and_is_recorded(algorithm, given,
                                                      clipping):
  with _command_line(algorithm=algorithm, task='synthetic', **given):
    recorded = build.hparams()
    assert recorded['clipping'] is clipping
    assert f.clipping_enabled(algorithm, f.CLIPPING.value) is clipping


def test_hparams_record_only_the_flags_in_use_and_the_derived_values():
  with _command_line(algorithm='adabest', task='synthetic_partitioned'):
    recorded = build.hparams()
  assert 'server_optimizer' not in recorded
  assert 'server_lr_scaling' not in recorded
  assert 'clipping' not in recorded
  assert 'budget_min' not in recorded
  assert recorded['client_learning_rate'] == 0.1  # the paper's, derived
  assert recorded['train_batch_size'] == 45
  assert recorded['client_epochs'] == 5
  assert recorded['adabest_mu'] == 0.02
  with _command_line(algorithm='fedopt', task='emnist',
                     server_optimizer='adam'):
    recorded = build.hparams()
  assert recorded['server_learning_rate'] == 0.001  # Table 3's FedAdam
  assert recorded['client_learning_rate'] == 0.1
  assert 'server_momentum' not in recorded  # Adam has none
  assert recorded['server_beta_1'] == 0.9
  assert 'adabest_mu' not in recorded
  assert 'num_clients' not in recorded  # emnist is not partitioned


@pytest.mark.parametrize('name, value', [
    ('server_learning_rate', 'nan'), ('server_learning_rate', 'inf'),
    ('client_learning_rate', '0'), ('adabest_mu', 'nan'),
    ('client_momentum', '1.0'), ('server_beta_2', '-0.1'),
    ('straggler_lambda', 'inf'), ('target_metric', 'test/acuracy'),
    ('task', 'mnist'), ('algorithm', 'fedavgg'),
    ('baseline_run_dir', '/tmp/fl_papers_no_such_run'),
])
def test_bad_values_are_refused_when_parsed(name, value):
  with flagsaver.flagsaver(), pytest.raises(flags.Error):
    FLAGS[name].parse(value)
    FLAGS.validate_all_flags()


def test_help_lists_every_task_and_algorithm():
  help_text = FLAGS['algorithm'].help + str(FLAGS['algorithm'].parser.enum_values)
  for name in families.ALGORITHM_NAMES:
    assert name in help_text
  for name in tasks.TASK_NAMES:
    assert name in str(FLAGS['task'].parser.enum_values)


@pytest.mark.parametrize('given, reason', [
    ({'clients_per_shard': '1'}, 'needs shards of clients'),
    ({'algorithm': 'scaffold', 'clients_per_shard': '1'},
     'needs shards of clients'),
    ({'zeroing': 'true'}, 'cannot be fused with --zeroing'),
    ({'algorithm': 'fedavgcm_gel', 'zeroing': 'true'},
     'cannot be fused with --zeroing'),
])
def test_lanes_are_refused_where_no_client_trains_on_lanes(given, reason):
  with _command_line(**{'algorithm': 'fedopt', 'lanes': '8', **given}):
    with pytest.raises(flag_rules.UnusedFlagError,
                       match=f'--lanes {reason}'):
      flag_rules.check_flags()
  for algorithm in families.ALGORITHM_NAMES:  # Every algorithm fuses.
    optimizer = {'client_optimizer': 'adam'} if algorithm == 'fedopt' else {}
    with _command_line(algorithm=algorithm, lanes='8', **optimizer):
      flag_rules.check_flags()


def test_a_learning_rate_without_a_tuned_value_is_refused_before_any_work():
  with _command_line(algorithm='fedopt', task='synthetic',
                     server_optimizer='sgdm'):
    with pytest.raises(tuned_defaults.MissingTunedRateError,
                       match='--server_optimizer=sgdm on --task=synthetic'):
      flag_rules.check_flags()
  # Given, the rates need no table.
  with _command_line(algorithm='fedopt', task='synthetic',
                     server_optimizer='sgdm', server_learning_rate='0.01',
                     client_learning_rate='0.1'):
    flag_rules.check_flags()
    assert build.hparams()['server_learning_rate'] == 0.01
  # FedSGD needs only its server rate.
  with _command_line(algorithm='fedsgd', task='cifar10',
                     server_optimizer='sgdm', server_learning_rate='0.01'):
    flag_rules.check_flags()


def test_a_family_record_refuses_an_incomplete_declaration():
  family = families.FAMILY_OF['fedopt']
  with pytest.raises(ValueError, match='why_not names'):
    dataclasses.replace(family, why_not={'fedopt': 'x'})
  with pytest.raises(ValueError, match='own flag lanes is used by'):
    dataclasses.replace(family, own_flags={'lanes': frozenset({'adabest'})})
  assert {name for f in families.FAMILIES for name in f.algorithms} == set(
      families.ALGORITHM_NAMES)
