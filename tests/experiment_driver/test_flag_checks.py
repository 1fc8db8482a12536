"""Flags whose values cannot hold together, or overflow where they are used,
are refused before any work (`flag_rules.check_flags`, the flag validators),
and the Python builders check their numbers as the flags do."""

from absl import flags
from absl.testing import flagsaver
import pytest

from experiment_driver import build  # noqa: F401  (defines the flags)
from experiment_driver import flag_rules
from fl_common import cohort_schedule
from fl_common import optimizers

FLAGS = flags.FLAGS


@pytest.fixture(autouse=True)
def parsed():
  if not FLAGS.is_parsed():
    FLAGS.mark_as_parsed()
  yield
  if not FLAGS.is_parsed():  # as the other modules' tests expect
    FLAGS.mark_as_parsed()


def _given(*args):
  FLAGS.unparse_flags()
  FLAGS(['run_experiment.py', *args])


@pytest.mark.parametrize('args,message', [
    (('--clients_per_round=20', '--rounds_to_double_cohort=1',
      '--max_cohort_size=10'),
     '--max_cohort_size=10 is below --clients_per_round=20'),
    (('--rounds_to_double_cohort=1', '--max_cohort_size=5'),  # default 10
     '--max_cohort_size=5 is below --clients_per_round=10'),
    (('--iterative_process=adabest', '--algorithm=fedopt'),
     '--iterative_process is another name for --algorithm'),
])
def test_flags_that_override_each_other_are_refused_naming_both(args,
                                                                 message):
  with flagsaver.flagsaver():
    _given(*args)
    with pytest.raises(flag_rules.ConflictingFlagsError, match=message):
      flag_rules.check_flags()


@pytest.mark.parametrize('args', [
    ('--clients_per_round=20', '--rounds_to_double_cohort=1',
     '--max_cohort_size=20'),
    ('--clients_per_round=20', '--max_cohort_size=10'),  # no doubling: unused
    ('--iterative_process=adabest',),
])
def test_flags_that_agree_pass_the_conflict_check(args):
  with flagsaver.flagsaver():
    _given(*args)
    assert flag_rules.conflicts() == []


@pytest.mark.parametrize('flag', [
    '--server_learning_rate=1e308', '--client_learning_rate=-3e38',
    '--synthetic_alpha=1e39', '--server_learning_rate=nan',
    '--client_learning_rate=0', '--dirichlet_alpha=0',
    '--synthetic_num_classes=100000', '--total_rounds=2000000',
    '--synthetic_num_clients=1', '--synthetic_num_clients=1000000',
])
def test_values_that_would_overflow_or_do_nothing_are_refused(flag):
  with flagsaver.flagsaver():
    FLAGS.unparse_flags()
    with pytest.raises(flags.IllegalFlagValueError):
      FLAGS(['run_experiment.py', flag])


@pytest.mark.parametrize('kwargs', [
    dict(learning_rate=float('nan')), dict(learning_rate=1e308),
    dict(learning_rate=0.0), dict(learning_rate=0.1, momentum=1.0),
    dict(learning_rate=0.1, epsilon=-1.0), dict(learning_rate='0.1'),
])
def test_build_optimizer_refuses_what_the_flags_refuse(kwargs):
  with pytest.raises(ValueError):
    optimizers.build_optimizer('sgdm', **kwargs)


def test_a_cohort_schedule_cannot_start_above_its_cap():
  with pytest.raises(ValueError, match='initial_cohort_size=20 is above'):
    cohort_schedule.DoublingCohortSchedule(initial_cohort_size=20,
                                           max_cohort_size=10)


@pytest.mark.parametrize('builder,kwargs', [
    ('adabest', dict(mu=float('nan'))), ('adabest', dict(mu=float('inf'))),
    ('adabest', dict(client_learning_rate=float('nan'))),
    ('adabest', dict(client_learning_rate=float('inf'))),
    ('feddyn', dict(mu=float('nan'))),
    ('scaffold', dict(server_learning_rate=float('inf'))),
    ('scaffold', dict(server_learning_rate=float('nan'))),
])
def test_stateful_builders_refuse_non_finite_numbers(builder, kwargs):
  import adabest_tff  # pylint: disable=g-import-not-at-top
  from tests import tiny_models  # pylint: disable=g-import-not-at-top
  build_fn = getattr(adabest_tff, f'build_{builder}')
  if builder != 'adabest':  # FedDyn and SCAFFOLD average over |S|
    kwargs = dict(kwargs, population_size=10)
  with pytest.raises(ValueError, match='finite'):
    build_fn(tiny_models.linear_model_fn(3), **kwargs)


@pytest.mark.parametrize('kwargs', [
    dict(learning_rate=float('inf')), dict(learning_rate=float('nan')),
    dict(learning_rate=0.1, proximal_strength=float('inf')),
    dict(learning_rate=0.1, proximal_strength=float('nan')),
])
def test_gel_client_work_refuses_non_finite_numbers(kwargs):
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from gel_tff import client_work  # pylint: disable=g-import-not-at-top
  args = dict(momentum=0.9, expected_steps=25,
              guessed_steps=client_work.REMAINING, proximal_strength=0.0,
              client_weighting=tff.learning.ClientWeighting.NUM_EXAMPLES)
  args.update(kwargs)
  with pytest.raises(ValueError):
    client_work.validate_client_work_args(**args)
