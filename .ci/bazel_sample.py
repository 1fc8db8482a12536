"""Prints the test modules CI runs under Bazel, as pytest `--ignore` flags.

CI (`.ci/run`) runs the modules tagged "ci" in tests/BUILD (`_CI_SAMPLE`)
under Bazel, then the rest of the suite under `make test` with these flags,
so that each module runs once. The list is read from tests/BUILD itself
(Starlark's list literal is Python's), so it is kept in one place.

  python3 .ci/bazel_sample.py          # --ignore=tests/<module>.py ...

Exits 1 with one `error:` line if the list is missing or names a module that
does not exist (a renamed module would otherwise run nowhere in CI).
"""

import ast
import os
import sys

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_NAME = '_CI_SAMPLE'


def sample_modules(build_path: str) -> list[str]:
  """The paths (from the repository root) of the modules in `_CI_SAMPLE`."""
  with open(build_path) as f:
    tree = ast.parse(f.read(), build_path)
  for node in tree.body:
    if (isinstance(node, ast.Assign) and len(node.targets) == 1
        and getattr(node.targets[0], 'id', None) == _NAME):
      return [os.path.join('tests', f'{name}.py')
              for name in ast.literal_eval(node.value)]
  raise ValueError(f'{build_path} has no {_NAME} list')


def main() -> int:
  try:
    modules = sample_modules(os.path.join(_REPO, 'tests', 'BUILD'))
    missing = [m for m in modules if not os.path.isfile(os.path.join(_REPO, m))]
    if missing or not modules:
      raise ValueError(f'{_NAME} in tests/BUILD names no module or modules'
                       f' that do not exist: {", ".join(missing)}')
  except (OSError, SyntaxError, ValueError) as e:
    print(f'error: {e}', file=sys.stderr)
    return 1
  print(' '.join(f'--ignore={m}' for m in modules))
  return 0


if __name__ == '__main__':
  sys.exit(main())
