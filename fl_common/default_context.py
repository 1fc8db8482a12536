"""Dropping TFF's default execution context in processes that run none.

Importing TFF installs a default context that starts its own `worker_binary`
on first use; that worker outlives Python and holds the parent's stdout
open, and if the context is still alive at interpreter exit, TFF prints a
`ServiceManager.__del__` traceback (`subprocess` is gone by then). Entry
points call `refuse_unmanaged_default_context()` first, before parsing
their arguments, so that bad input exits with its one `error:` line and
every computation runs inside `fl_engine.runtime`'s
`local_runtime()` or `remote_runtime()`. Here rather than in the driver's
runtime so that command-line tools outside the driver
(`python -m reproduce.sweep`) can call it; the runtime re-exports it.
"""

import gc

import tensorflow_federated as tff
# Below TFF's public API: the context that raises on use, as TFF installs
# when no runtime is set; `tff.framework` exports no such context. And the
# runner whose thread the import's context runs on (`end_import_thread`).
from fl_common.tff_private import async_utils
from fl_common.tff_private import runtime_error_context


# Whether this process (or the one it was forked from) has collected the
# context TFF's import installed, after replacing it.
_tffs_context_collected = False


def collect_replaced_context() -> None:
  """Collects the default context just replaced, if it may be TFF's own.

  TFF's import-time context sits in reference cycles, so only a full
  collection drops it before exit. The first replacement in a process drops
  it; every later one drops a context of this package's (refusing, or
  `fl_engine.runtime`'s managed one), which starts no worker and can wait
  for Python's own collections: a full one costs ~0.3 s once TensorFlow is
  loaded, at every driver start and in every forked run.
  """
  global _tffs_context_collected
  if not _tffs_context_collected:
    gc.collect()
    _tffs_context_collected = True


def refuse_unmanaged_default_context() -> None:
  """Replaces TFF's default context by one that refuses to run.

  Importing the package does not do this: plain TFF code keeps working.
  """
  tff.framework.set_default_context(
      runtime_error_context.RuntimeErrorContext())
  collect_replaced_context()


def end_import_thread() -> None:
  """Refuses the default context (as above) and ends the thread it ran on.

  The context TFF's import installs runs its event loop on a thread of an
  `AsyncThreadRunner`, which the thread itself keeps alive: dropping the
  context leaves the thread running until the process ends. A process that
  forks after importing TFF (`experiment_driver.prestart`) ends it first, so
  that it forks with no thread but its own. TFF has no public way to stop
  it: this calls the runner's own finalizer (what its `__del__` would).
  """
  runner = getattr(tff.framework.get_context_stack().current,
                   '_async_runner', None)
  refuse_unmanaged_default_context()
  if isinstance(runner, async_utils.AsyncThreadRunner):
    runner._finalizer(runner._event_loop, runner._thread)  # pylint: disable=protected-access
