"""The repository's packages, as the tests enumerate them.

Not a test module: `test_import_graph` (the layers' import rules) and
`conformance_builders` (every public builder) import it. The paper packages
are found, not listed: a new one (a new paper's or family's) is in every
test that goes over them without a test edit.
"""

import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The layers below and above the algorithms; every other package of the
# repository is a paper's (or a new family's) algorithms.
LAYERS = ('fl_common', 'fl_engine', 'tasks', 'experiment_driver',
          'reproduce', 'bench', 'tests')


def paper_packages() -> tuple[str, ...]:
  """The packages of algorithms (every package that is not a layer)."""
  return tuple(sorted(
      name for name in os.listdir(REPO)
      if os.path.isfile(os.path.join(REPO, name, '__init__.py'))
      and name not in LAYERS and not name.startswith('bazel-')))
