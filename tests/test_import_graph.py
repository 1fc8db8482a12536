"""The architecture, checked on the source: who may import whom, and size.

Four layers, each importing only those below it: the library (`fl_common`:
optimizers, schedules, the stateful-client template, aggregators,
diagnostics, execution on shards, the run directory's layout) and, beside
it, the tasks (`tasks`, which import no algorithm); the paper packages
(`large_cohort`, `adabest_tff`, `gel_tff`), which import the library, TFF
and never each other, so what two families need is in the library; the
driver (`experiment_driver`); the experiments (`reproduce`: sweeps,
analysis, figures, reports), which run the driver as subprocesses. A module
over 400 lines says why in its docstring.
"""

import ast
import os

import pytest

from tests import repo_layout

_REPO = repo_layout.REPO
_PAPERS = repo_layout.paper_packages()
_FORBIDDEN = {
    **{paper: set(_PAPERS) - {paper} | {'experiment_driver', 'reproduce'}
       for paper in _PAPERS},
    'fl_common': set(_PAPERS) | {'experiment_driver', 'tasks', 'reproduce'},
    'tasks': set(_PAPERS) | {'experiment_driver', 'fl_common', 'reproduce'},
    # The experiments run the driver as subprocesses and read run
    # directories (`fl_common.run_layout`): they need no algorithm or task.
    'reproduce': set(_PAPERS) | {'tasks'},
}
_MAX_LINES = 400
# Every package imports `tf_environment` first: it sets what TensorFlow
# reads at import (Keras 2 for TFF), so it must run before any of them
# imports TF. `tff_private` is the one door to TFF's private tree
# (`tests/fl_common/test_tff_private.py`), open to every package.
_ALWAYS_ALLOWED = ('fl_common.tf_environment', 'fl_common.tff_private')


def _modules(package):
  directory = os.path.join(_REPO, package)
  return sorted(os.path.join(directory, name) for name in os.listdir(directory)
                if name.endswith('.py'))


def _imported_packages(path):
  with open(path) as f:
    tree = ast.parse(f.read())
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      names = [f'{node.module}.{alias.name}' for alias in node.names]
    else:
      continue
    for name in names:
      if not any(name == allowed or name.startswith(allowed + '.')
                 for allowed in _ALWAYS_ALLOWED):
        yield name.split('.')[0]


@pytest.mark.parametrize('package', sorted(_FORBIDDEN))
def test_packages_import_only_what_the_architecture_allows(package):
  assert {'large_cohort', 'adabest_tff', 'gel_tff'} <= set(_PAPERS)
  violations = [
      (os.path.relpath(path, _REPO), imported)
      for path in _modules(package)
      for imported in _imported_packages(path)
      if imported in _FORBIDDEN[package]]
  assert not violations


def test_a_long_module_says_why_in_its_docstring():
  packages = (*_FORBIDDEN, 'experiment_driver', 'experiment_driver/runtime',
              'bench')
  unexplained = []
  for package in packages:
    for path in _modules(package):
      with open(path) as f:
        text = f.read()
      if text.count('\n') > _MAX_LINES:
        docstring = ast.get_docstring(ast.parse(text)) or ''
        if 'Why one module:' not in docstring:
          unexplained.append(os.path.relpath(path, _REPO))
  assert not unexplained


# Test modules named for no single module, with what they test.
_ACROSS_MODULES = {
    # The package as a user runs it.
    'test_builders_conformance.py': 'every public builder, one suite',
    'test_docs.py': 'the README and docs/ commands',
    'test_extending.py': "docs/extending.md's recipes",
    'test_import_graph.py': 'these rules',
    'test_install.py': 'requirements/ and setup.py',
    'test_pytest_main.py': 'the Bazel launcher, tests/pytest_main.py',
    'test_run_faults.py': "run_experiment.py's faults and resumption",
    'test_damage_fedopt.py': 'the damage matrix of every run file, FedOpt',
    'test_damage_adabest.py': 'the damage matrix of every run file, AdaBest',
    'test_damage_gel.py': 'the damage matrix of every run file, GeL',
    'bench/test_bench.py': 'the benchmark package',
    'experiment_driver/test_flag_checks.py': 'flag_groups and flag_rules',
    'experiment_driver/runtime/test_remote_workers.py':
        '--worker_addresses, through the driver',
    'tasks/test_tfds_downloads.py': 'data_files and the TFDS image tasks',
    'large_cohort/test_fedopt_on_shards.py':
        'fedopt.build_fedopt and build_fedsgd on shards (fl_common.compose)',
    'gel_tff/test_gel_on_shards.py':
        'gel.build_gel and build_budgeted_baseline on shards'
        ' (fl_common.compose)',
}


def test_tests_mirror_the_packages():
  # tests/<package>/test_<module>.py tests <package>/<module>.py, and
  # tests/<package>/test_<package>.py the package's __init__.
  if not os.path.isfile(os.path.join(_REPO, 'tests', 'test_docs.py')):
    pytest.skip('other test modules are not in the runfiles under `bazel '
                'test`; `make test` checks the layout')
  strays = []
  for directory, _, names in os.walk(os.path.join(_REPO, 'tests')):
    package = os.path.relpath(directory, os.path.join(_REPO, 'tests'))
    for name in names:
      if not (name.startswith('test_') and name.endswith('.py')):
        continue
      path = os.path.normpath(os.path.join(package, name))
      module = name[len('test_'):]
      tested = (os.path.join(_REPO, module) if package == '.' else
                os.path.join(_REPO, package, module))
      is_init = module[:-len('.py')] == os.path.basename(package)
      if not (os.path.isfile(tested) or is_init or path in _ACROSS_MODULES):
        strays.append(path)
  assert not strays
  for path in _ACROSS_MODULES:
    assert os.path.isfile(os.path.join(_REPO, 'tests', path)), path
