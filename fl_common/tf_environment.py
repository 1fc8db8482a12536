"""TensorFlow's environment, set before TensorFlow is imported.

Three settings that TensorFlow reads once, when it is imported, so every
package of this project imports this module before anything imports
TensorFlow (the packages' `__init__`s and the entry points do):

* **Keras 2.** TFF 0.87 wraps Keras 2 models (`tff.learning.models.
  from_keras_model` reads Keras 2 internals), and since TensorFlow 2.16
  `tf.keras` is Keras 3 unless `TF_USE_LEGACY_KERAS=1` routes it to the
  `tf_keras` package. Importing this module sets the variable; if TensorFlow
  was imported before with Keras 3, it says so (`LegacyKerasError`) instead
  of letting TFF fail later on `'Sequential' object has no attribute
  '_is_compiled'`.
* **A quiet terminal.** `TF_CPP_MIN_LOG_LEVEL` defaults to 3, and unless
  the user asked for output (`FL_PAPERS_VERBOSE=1`, absl's `--verbosity`/`-v`
  on the command line, or a level below 2) or imported TensorFlow already,
  TensorFlow is imported here with the process's stderr pointed at a
  temporary file, replayed if the import fails:
  its C++ start-up lines (absl's pre-initialization warning, CPU features,
  and on the CUDA build "Unable to register cuDNN factory" and the like) are
  written before the level is read. It happens on import, not in the entry
  points, because `python -m tasks.prepare_data` imports the package (and
  so TensorFlow) before its module runs.

* **oneDNN for the task's model.** TensorFlow's oneDNN graph rewrites
  (`TF_ENABLE_ONEDNN_OPTS`, on by default on x86, read once at import) make
  a convolution or an LSTM faster and a tiny model slower: a oneDNN
  primitive per small op. For the tasks in `ONEDNN_OFF_TASKS`, named on the
  command line (`--task=...`, as `run_experiment.py` and the reproductions'
  runs take it), the variable is set to 0 unless the user set it. The rounds
  run in this process (the in-process runtime), so this is where it is
  decided; the driver's `runtime:` line says which (`onednn_setting()`).
  Which tasks: those whose model ran markedly faster with the rewrites off
  when measured (`docs/runtime.md`, "oneDNN"); LEAF Synthetic's softmax
  regression does, the MLPs and CNNs do not. The setting shifts float32
  results by ~1e-7, as any change of kernels does.

* **No Keras 3 while TFF is imported.** TFF imports tensorflow_model_
  optimization, whose pruning registry tries `from keras.src.engine import
  base_layer` on the Keras 3 package, which has no such module: the import
  always fails, and catches the failure, after loading all of Keras 3 at
  every process's start. While `tensorflow_federated` is being imported,
  `keras` is refused at once (`_NoKeras3DuringTffImport`), which ends in the
  same failure and the same fallback without loading it. Nothing else is
  affected: `import keras` works before and after.

And one at exit: if TFF was imported, its default context is dropped while
Python can still run it (`atexit`), so that a process that never started a
runtime (`python -m tasks.prepare_data --help`) ends without TFF's
`ServiceManager.__del__` traceback (`fl_common.default_context` says why).
"""

import atexit
import os
import sys
import tempfile

LEGACY_KERAS = 'TF_USE_LEGACY_KERAS'
VERBOSE = 'FL_PAPERS_VERBOSE'
ONEDNN = 'TF_ENABLE_ONEDNN_OPTS'
# Tasks whose model runs faster with oneDNN's rewrites off (module
# docstring): a few small ops per step, a softmax among them.
ONEDNN_OFF_TASKS = frozenset({'synthetic'})
_TRUE = ('1', 'true', 'True')


class LegacyKerasError(ImportError):
  """TensorFlow was imported with Keras 3 before this project."""


def _use_legacy_keras() -> None:
  tf = sys.modules.get('tensorflow')
  already_set = os.environ.get(LEGACY_KERAS) in _TRUE
  os.environ[LEGACY_KERAS] = '1'
  if tf is None or already_set:
    return
  # `_tf_uses_legacy_keras` is what TensorFlow >= 2.16 decided at import.
  if not getattr(tf, '_tf_uses_legacy_keras', True):
    raise LegacyKerasError(
        'TensorFlow was imported with Keras 3 before this package; TFF 0.87'
        ' needs Keras 2 (tf_keras): set TF_USE_LEGACY_KERAS=1 before'
        ' importing TensorFlow, or import this package first')


def verbose(argv: list[str] | None = None) -> bool:
  """True if the user asked for library output: the variable or --verbosity."""
  if os.environ.get(VERBOSE, '') not in ('', '0'):
    return True
  argv = sys.argv if argv is None else argv
  return any(arg.split('=')[0] in ('--verbosity', '-v', '--v')
             for arg in argv[1:])


def flag_value(argv: list[str], name: str) -> str | None:
  """The value of `--name=value` or `--name value` in `argv[1:]` (the last
  one given), or None: a flag read before absl parses the command line."""
  value = None
  args = argv[1:]
  for i, arg in enumerate(args):
    if arg == '--':
      break
    if arg.startswith(f'--{name}='):
      value = arg.split('=', 1)[1]
    elif arg == f'--{name}' and i + 1 < len(args):
      value = args[i + 1]
  return value


def _choose_onednn(argv: list[str] | None = None) -> None:
  """Turns oneDNN's rewrites off for a task in `ONEDNN_OFF_TASKS`, unless
  the user set the variable or TensorFlow was imported already."""
  argv = sys.argv if argv is None else argv
  if ONEDNN in os.environ or 'tensorflow' in sys.modules:
    return
  if flag_value(argv, 'task') in ONEDNN_OFF_TASKS:
    os.environ[ONEDNN] = '0'


def onednn_setting() -> str:
  """This process's oneDNN setting as TensorFlow read it: `off` if
  `TF_ENABLE_ONEDNN_OPTS=0`, `on` if `1`, else `default` (on, on x86)."""
  return {'0': 'off', '1': 'on'}.get(os.environ.get(ONEDNN, ''), 'default')


def _quiet_import() -> None:
  """Imports TensorFlow with its start-up lines kept off the terminal."""
  level = os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
  if verbose() or level not in ('2', '3') or 'tensorflow' in sys.modules:
    return
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile() as captured:
    os.dup2(captured.fileno(), 2)
    try:
      import tensorflow  # pylint: disable=g-import-not-at-top,unused-import
    except BaseException:
      os.dup2(saved, 2)
      captured.seek(0)
      sys.stderr.write(captured.read().decode(errors='replace'))
      raise
    finally:
      os.dup2(saved, 2)
      os.close(saved)


class _NoKeras3DuringTffImport:
  """A `sys.meta_path` finder refusing the `keras` package while
  `tensorflow_federated` is being imported (module docstring)."""

  @staticmethod
  def find_spec(name, path=None, target=None):
    del path, target
    if name != 'keras':
      return None
    spec = getattr(sys.modules.get('tensorflow_federated'), '__spec__', None)
    if getattr(spec, '_initializing', False):
      raise ModuleNotFoundError(
          'keras (Keras 3) is not loaded while TFF is imported', name=name)
    return None


def _drop_tff_default_context() -> None:
  if 'tensorflow_federated' in sys.modules:
    from fl_common import default_context  # pylint: disable=g-import-not-at-top
    default_context.refuse_unmanaged_default_context()


_use_legacy_keras()
_choose_onednn()
_quiet_import()
if not any(isinstance(f, _NoKeras3DuringTffImport) for f in sys.meta_path):
  sys.meta_path.insert(0, _NoKeras3DuringTffImport())
atexit.register(_drop_tff_default_context)
