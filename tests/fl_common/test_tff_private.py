"""TFF's private tree is reached through one module, `fl_common.tff_private`.

A TFF upgrade that moves or drops a private module or attribute the package
uses then breaks in that one module (at import) and in these tests, not
somewhere in the middle of a run.
"""

import ast
import os

from fl_common import tff_private
import tests

_REPO = tests.REPO
_QUARANTINE = os.path.join(_REPO, 'fl_common', 'tff_private.py')
_PRIVATE_TREES = ('tensorflow_federated.python', 'tensorflow_federated.proto')


def _python_files():
  for root, dirs, files in os.walk(_REPO):
    dirs[:] = [d for d in dirs
               if not d.startswith(('.', 'bazel-', '__pycache__'))]
    for name in files:
      if name.endswith('.py'):
        yield os.path.join(root, name)


def _tree(path):
  with open(path) as f:
    return ast.parse(f.read(), path)


def _is_private(module):
  return module.startswith(_PRIVATE_TREES)


def test_only_the_quarantine_imports_tffs_private_tree():
  offenders = []
  for path in _python_files():
    if path == _QUARANTINE:
      continue
    for node in ast.walk(_tree(path)):
      if isinstance(node, ast.ImportFrom) and node.module:
        modules = [node.module]
      elif isinstance(node, ast.Import):
        modules = [alias.name for alias in node.names]
      else:
        continue
      offenders += [(os.path.relpath(path, _REPO), node.lineno, m)
                    for m in modules if _is_private(m)]
  assert not offenders


def _quarantined_names():
  """Name in `tff_private` -> the TFF module it is."""
  names = {}
  for node in ast.walk(_tree(_QUARANTINE)):
    if isinstance(node, ast.ImportFrom) and _is_private(node.module or ''):
      for alias in node.names:
        names[alias.asname or alias.name] = f'{node.module}.{alias.name}'
  return names


def test_the_quarantine_holds_every_private_module_it_lists():
  names = _quarantined_names()
  assert len(names) > 40
  for name, qualified in names.items():
    assert getattr(tff_private, name).__name__ == qualified


def test_every_private_attribute_the_package_reads_exists():
  """Each `module._name` read on a quarantined module, anywhere."""
  uses = []
  for path in _python_files():
    tree = _tree(path)
    aliases = {}
    for node in ast.walk(tree):
      if (isinstance(node, ast.ImportFrom) and
          node.module == 'fl_common.tff_private'):
        for alias in node.names:
          aliases[alias.asname or alias.name] = alias.name
    for node in ast.walk(tree):
      if (isinstance(node, ast.Attribute) and
          isinstance(node.value, ast.Name) and node.value.id in aliases and
          node.attr.startswith('_') and not node.attr.startswith('__')):
        uses.append((os.path.relpath(path, _REPO), aliases[node.value.id],
                     node.attr))
  assert uses  # The runtime reads a few (e.g. a context stack's internals).
  missing = [use for use in uses
             if not hasattr(getattr(tff_private, use[1]), use[2])]
  assert not missing
