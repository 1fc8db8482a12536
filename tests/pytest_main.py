"""Runs one pytest module as a Bazel `py_test` (`main` of every tests/ target).

    pytest_main.py tests/test_x.py

Bazel starts it in the runfiles copy of the workspace; pytest runs there with
the workspace's pytest.ini and rootdir, so tests/conftest.py (the suite's TFF
runtime) applies as under `make test`. It also follows Bazel's test
environment: results go to `$XML_OUTPUT_FILE` (per-test-case results in
`bazel-testlogs`), temporary directories and matplotlib's cache (the
sandbox's $HOME is read-only) under `$TEST_TMPDIR`, and `--test_filter=EXPR`
becomes `pytest -k EXPR`.
"""

import os
import sys

import pytest

_WORKSPACE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pytest_args(test_file: str, environ: dict[str, str]) -> list[str]:
  """Returns pytest's command line for `test_file` in Bazel's `environ`."""
  args = [
      test_file,
      f'--rootdir={_WORKSPACE_DIR}',
      '--config-file', os.path.join(_WORKSPACE_DIR, 'pytest.ini'),
      # The runfiles tree is Bazel's, not a place for pytest's cache.
      '-p', 'no:cacheprovider',
      '-q',
  ]
  if 'XML_OUTPUT_FILE' in environ:
    args.append(f'--junitxml={environ["XML_OUTPUT_FILE"]}')
  if 'TEST_TMPDIR' in environ:
    args.append(f'--basetemp={os.path.join(environ["TEST_TMPDIR"], "pytest")}')
  if environ.get('TESTBRIDGE_TEST_ONLY'):
    args += ['-k', environ['TESTBRIDGE_TEST_ONLY']]
  return args


def main(argv: list[str]) -> int:
  """Runs pytest on the module `argv[1]`; returns pytest's exit code."""
  if len(argv) != 2:
    raise SystemExit(f'usage: {argv[0]} tests/test_<module>.py (got {argv[1:]})')
  if 'TEST_TMPDIR' in os.environ:
    os.environ.setdefault(
        'MPLCONFIGDIR', os.path.join(os.environ['TEST_TMPDIR'], 'matplotlib'))
  return pytest.main(pytest_args(argv[1], os.environ))


if __name__ == '__main__':
  sys.exit(main(sys.argv))
