"""Tests of tests/pytest_main.py, the launcher of every Bazel py_test."""

import os
import subprocess
import sys
from xml.etree import ElementTree

_LAUNCHER = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                         'pytest_main.py')
# What Bazel sets for a test; removed so that an outer Bazel run of this
# module does not leak into the launcher runs below.
_BAZEL_TEST_ENV = ('XML_OUTPUT_FILE', 'TEST_TMPDIR', 'TESTBRIDGE_TEST_ONLY')
_FAKE_TESTS = '''\
def test_kept(tmp_path):
  (tmp_path / 'written').touch()

def test_dropped():
  assert False, 'test_dropped ran'
'''


def _run_launcher(*args, **bazel_env):
  env = {k: v for k, v in os.environ.items() if k not in _BAZEL_TEST_ENV}
  env.update({k: str(v) for k, v in bazel_env.items()})
  return subprocess.run([sys.executable, _LAUNCHER, *args], env=env,
                        capture_output=True, text=True, timeout=300,
                        stdin=subprocess.DEVNULL)


def _fake_test_file(tmp_path):
  path = tmp_path / 'test_fake.py'
  path.write_text(_FAKE_TESTS)
  return str(path)


def test_filter_selects_tests_and_results_go_to_bazel_paths(tmp_path):
  xml_path = tmp_path / 'test.xml'
  test_tmpdir = tmp_path / 'test_tmpdir'
  test_tmpdir.mkdir()
  result = _run_launcher(
      _fake_test_file(tmp_path), XML_OUTPUT_FILE=xml_path,
      TEST_TMPDIR=test_tmpdir, TESTBRIDGE_TEST_ONLY='kept')
  assert result.returncode == 0, result.stdout + result.stderr
  ran = [case.get('name')
         for case in ElementTree.parse(xml_path).getroot().iter('testcase')]
  assert ran == ['test_kept']
  assert list(test_tmpdir.glob('pytest/test_kept*/written'))


def test_failing_test_fails_the_target(tmp_path):
  result = _run_launcher(_fake_test_file(tmp_path))
  assert result.returncode == 1
  assert 'test_dropped ran' in result.stdout


def test_missing_test_file_argument_is_a_usage_error():
  result = _run_launcher()
  assert result.returncode != 0
  assert 'usage:' in result.stderr
