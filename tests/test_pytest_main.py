"""Tests of tests/pytest_main.py, the launcher of every Bazel py_test."""

import json
import os
import subprocess
import sys
from xml.etree import ElementTree

_LAUNCHER = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                         'pytest_main.py')
# What Bazel (or the launcher) sets for a test; removed so that an outer
# Bazel run of this module does not leak into the launcher runs below.
_LAUNCHER_ENV = ('XML_OUTPUT_FILE', 'TEST_TMPDIR', 'TESTBRIDGE_TEST_ONLY',
                 'MPLCONFIGDIR')
# test_kept reports where its tmp_path and matplotlib's cache are.
_FAKE_TESTS = '''\
import json
import os

def test_kept(tmp_path):
  with open(os.environ['FAKE_REPORT'], 'w') as f:
    json.dump([str(tmp_path), os.environ.get('MPLCONFIGDIR')], f)

def test_dropped():
  assert False, 'test_dropped ran'
'''


def _run_launcher(*args, **bazel_env):
  env = {k: v for k, v in os.environ.items() if k not in _LAUNCHER_ENV}
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
  report_path = tmp_path / 'report.json'
  result = _run_launcher(
      _fake_test_file(tmp_path), XML_OUTPUT_FILE=xml_path,
      TEST_TMPDIR=test_tmpdir, TESTBRIDGE_TEST_ONLY='kept',
      FAKE_REPORT=report_path)
  assert result.returncode == 0, result.stdout + result.stderr
  ran = [case.get('name')
         for case in ElementTree.parse(xml_path).getroot().iter('testcase')]
  assert ran == ['test_kept']
  kept_tmp_path, mplconfigdir = json.loads(report_path.read_text())
  assert os.path.dirname(kept_tmp_path) == str(test_tmpdir / 'pytest')
  assert mplconfigdir == str(test_tmpdir / 'matplotlib')


def test_failing_test_fails_the_target(tmp_path):
  result = _run_launcher(_fake_test_file(tmp_path),
                         FAKE_REPORT=tmp_path / 'report.json')
  assert result.returncode == 1
  assert 'test_dropped ran' in result.stdout
  assert '1 failed, 1 passed' in result.stdout


def test_missing_test_file_argument_is_a_usage_error():
  result = _run_launcher()
  assert result.returncode != 0
  assert 'usage:' in result.stderr
