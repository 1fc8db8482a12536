"""The architecture, checked on the source: who may import whom, and size.

Layers, each importing only those below it (docs/architecture.md draws
them): the math the papers share (`fl_common`: optimizers, schedules,
aggregators, diagnostics, the run directory's layout, TensorFlow's
environment); beside it, the execution engine (`fl_engine`: the one
composer, per client or on shards, stateful clients, the TFF runtimes),
which imports the math, and the tasks (`tasks`, which import no
algorithm); the paper packages (`large_cohort`, `adabest_tff`, `gel_tff`),
which import the math and the engine, TFF and never each other, so what two
families need is below them; the driver (`experiment_driver`); the
experiments (`reproduce`: sweeps, analysis, figures, reports), which run
the driver as subprocesses. No module imports itself through others, and no
package another that imports it. A module over 400 lines says why in its
docstring.
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
    # The math the papers share, below the engine that runs it.
    'fl_common': set(_PAPERS) | {'fl_engine', 'experiment_driver', 'tasks',
                                 'reproduce'},
    # The execution engine: beside the math (which it imports), below the
    # papers and the driver.
    'fl_engine': set(_PAPERS) | {'experiment_driver', 'tasks', 'reproduce'},
    'tasks': set(_PAPERS) | {'experiment_driver', 'fl_common', 'fl_engine',
                             'reproduce'},
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
  """The package's modules, its subpackages' included."""
  return sorted(os.path.join(directory, name)
                for directory, _, names in os.walk(os.path.join(_REPO, package))
                for name in names if name.endswith('.py'))


def _module_name(path):
  name = os.path.relpath(path, _REPO)[:-len('.py')].replace(os.sep, '.')
  return name[:-len('.__init__')] if name.endswith('.__init__') else name


def _import_graph():
  """Module -> the repository's modules it imports (at its top or inside a
  function), for every package but the tests, and the driver's script."""
  paths = [p for package in (*_FORBIDDEN, 'experiment_driver', 'bench')
           for p in _modules(package)]
  paths.append(os.path.join(_REPO, 'run_experiment.py'))
  modules = {_module_name(p): p for p in paths}
  graph = {}
  for name, path in modules.items():
    with open(path) as f:
      tree = ast.parse(f.read())
    imported = set()
    for node in ast.walk(tree):
      if isinstance(node, ast.Import):
        imported.update(a.name for a in node.names if a.name in modules)
      elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
        for alias in node.names:
          full = f'{node.module}.{alias.name}'
          if full in modules:
            imported.add(full)
          elif node.module in modules:
            imported.add(node.module)
    graph[name] = imported - {name}
  return graph


def _cycles(graph):
  """The strongly connected parts of `graph` with more than one node."""
  index, low, stack, found = {}, {}, [], []

  def visit(node):
    index[node] = low[node] = len(index)
    stack.append(node)
    for other in graph.get(node, ()):
      if other not in index:
        visit(other)
        low[node] = min(low[node], low[other])
      elif other in stack:
        low[node] = min(low[node], index[other])
    if low[node] == index[node]:
      part = []
      while not part or part[-1] != node:
        part.append(stack.pop())
      if len(part) > 1:
        found.append(sorted(part))

  for node in list(graph):
    if node not in index:
      visit(node)
  return found


def test_no_circle_of_imports_between_modules_or_packages():
  graph = _import_graph()
  assert _cycles(graph) == []
  packages = {}
  for module, imported in graph.items():
    for other in imported:
      if other.split('.')[0] != module.split('.')[0]:
        packages.setdefault(module.split('.')[0], set()).add(
            other.split('.')[0])
  assert _cycles(packages) == []
  # The math never reaches the engine; the engine reaches the math.
  assert 'fl_engine' not in packages.get('fl_common', set())
  assert 'fl_common' in packages['fl_engine']
  # A circle is found: the one this repository had (the environment, the
  # default context, the door to TFF's private tree).
  assert _cycles({'tf_environment': {'default_context'},
                  'default_context': {'tff_private'},
                  'tff_private': {'tf_environment'}}) == [
                      ['default_context', 'tf_environment', 'tff_private']]


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
  packages = (*_FORBIDDEN, 'experiment_driver', 'fl_engine/runtime',
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
    'fl_engine/runtime/test_remote_workers.py':
        '--worker_addresses, through the driver',
    'tasks/test_tfds_downloads.py': 'data_files and the TFDS image tasks',
    'large_cohort/test_fedopt_on_shards.py':
        'fedopt.build_fedopt and build_fedsgd on shards (fl_engine.compose)',
    'gel_tff/test_gel_on_shards.py':
        'gel.build_gel and build_budgeted_baseline on shards'
        ' (fl_engine.compose)',
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
