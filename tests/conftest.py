"""Test-suite setup: one TFF runtime owned by the suite, stopped at the end.

Data downloads are off for the whole suite (`FL_PAPERS_OFFLINE`). Every test
runs under the in-process runtime (`fl_engine.runtime.local_runtime`)
unless it installs another: the tests of TFF's worker start their own
`worker_binary` (`runtime.worker_runtime`), stopped when they end (and by
the kernel if pytest itself dies). Tests that start the driver as a
subprocess check that it leaves no worker behind.

Under pytest-xdist's `--dist loadfile` (`make test`) whole modules go to
the processes in collection order, so the longest modules are collected
first (`LONGEST_MODULES`) and short ones fill the end; the run ends with the
modules' summed durations, the figures that list comes from.
"""

import collections
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
# Nothing in the suite reaches beyond loopback: the driver subprocesses the
# tests start inherit this; the download tests serve files on 127.0.0.1 and
# turn it off for their own commands.
os.environ['FL_PAPERS_OFFLINE'] = '1'

from fl_engine import runtime  # pylint: disable=g-import-not-at-top


def pytest_configure(config):
  """In every pytest process, pytest-xdist's controller included (it runs
  no test, so no session fixture): TFF's default context refuses to run, and
  is dropped now rather than at exit (`refuse_unmanaged_default_context`)."""
  del config
  runtime.refuse_unmanaged_default_context()


@pytest.fixture(scope='session', autouse=True)
def tff_runtime():
  # A test that ran a computation outside this runtime would start TFF's own
  # unmanaged worker: refuse instead.
  runtime.refuse_unmanaged_default_context()
  with runtime.local_runtime() as devices:
    yield devices


# The longest modules, longest first, from the summed durations `make test`
# prints (CI's log); the others follow, most tests first. A module that
# grows long only finishes later than it could: nothing else depends on it.
LONGEST_MODULES = (
    'tests/reproduce/test_cluster.py',
    'tests/test_run_faults.py',
    'tests/experiment_driver/test_flag_rules.py',
    'tests/test_damage_adabest.py',
    'tests/bench/test_bench.py',
    'tests/test_builders_conformance.py',
    'tests/test_extending.py',
    'tests/fl_engine/runtime/test_in_process.py',
    'tests/test_damage_gel.py',
    'tests/test_damage_fedopt.py',
    'tests/gel_tff/test_gel_on_shards.py',
    'tests/test_docs.py',
    'tests/fl_engine/runtime/test_runtime.py',
    'tests/fl_engine/test_lanes.py',
    'tests/test_run_experiment.py',
    'tests/fl_engine/test_fused_stateful.py',
    'tests/experiment_driver/test_prestart.py',
    'tests/experiment_driver/test_training_loop.py',
    'tests/fl_engine/runtime/test_remote_workers.py',
    'tests/large_cohort/test_fedopt_on_shards.py',
    'tests/tasks/test_digits.py',
    'tests/fl_engine/test_resident.py',
    'tests/gel_tff/test_gel.py',
    'tests/tasks/test_data_files.py',
    'tests/reproduce/test_reproduce.py',
)


def _module(nodeid: str) -> str:
  return nodeid.split('::', 1)[0]


def pytest_collection_modifyitems(items):
  """Orders the modules: `LONGEST_MODULES` first, then by test count (as
  pytest-xdist's own `--loadscope-reorder` would); tests keep their order
  within a module."""
  counts = collections.Counter(_module(item.nodeid) for item in items)
  rank = {module: i for i, module in enumerate(LONGEST_MODULES)}
  order = {id(item): i for i, item in enumerate(items)}
  items.sort(key=lambda item: (
      rank.get(_module(item.nodeid), len(rank)),
      -counts[_module(item.nodeid)], _module(item.nodeid), order[id(item)]))


_module_seconds = collections.Counter()


def pytest_runtest_logreport(report):
  _module_seconds[_module(report.nodeid)] += report.duration


def pytest_terminal_summary(terminalreporter):
  """The 20 longest modules, setup, call and teardown summed: the figures
  `LONGEST_MODULES` is ordered by."""
  if len(_module_seconds) < 2:
    return
  terminalreporter.write_sep('=', 'longest modules (s, all phases summed)')
  for module, seconds in _module_seconds.most_common(20):
    terminalreporter.write_line(f'{seconds:8.1f}  {module}')
