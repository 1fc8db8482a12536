"""Test-suite setup: one TFF runtime owned by the suite, stopped at the end.

Data downloads are off for the whole suite (`FL_PAPERS_OFFLINE`). Every test
runs under the in-process runtime (`experiment_driver.runtime.local_runtime`)
unless it installs another: the tests of TFF's worker start their own
`worker_binary` (`runtime.worker_runtime`), stopped when they end (and by
the kernel if pytest itself dies). Tests that start the driver as a
subprocess check that it leaves no worker behind.
"""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
# Nothing in the suite reaches beyond loopback: the driver subprocesses the
# tests start inherit this; the download tests serve files on 127.0.0.1 and
# turn it off for their own commands.
os.environ['FL_PAPERS_OFFLINE'] = '1'

from experiment_driver import runtime  # pylint: disable=g-import-not-at-top


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
