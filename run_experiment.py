"""Runs one federated-learning experiment from absl flags.

    python run_experiment.py --task=stackoverflow --server_optimizer=lamb \
        --use_synthetic_data --total_rounds=3

Flags in, one call out: build the task and the learning process named by the
flags, then hand both to the training loop. Results go to
`<root_output_dir>/<experiment_name>/` (metrics.csv, tensorboard/,
checkpoints/, hparams.json); rerunning the same command resumes the run.
"""

import os
import signal
import sys


def _stopped_while_starting(signum, frame):
  """Ctrl-C, SIGTERM or SIGHUP during the imports: nothing is written yet."""
  del frame
  what = {signal.SIGINT: 'interrupted', signal.SIGTERM: 'terminated',
          signal.SIGHUP: 'hung up'}[signum]
  # To the terminal's stderr: TensorFlow's import runs with fd 2 captured
  # (`fl_common.tf_environment`).
  os.write(_STDERR, f'{what} while starting, before the run; nothing was'
           ' written\n'.encode())
  os._exit(128 + signum)  # pylint: disable=protected-access


if __name__ == '__main__':
  _STDERR = os.dup(2)
  # TensorFlow's imports take seconds: a signal then is one line, not a
  # traceback through them. `main` installs the run's own handlers.
  for _signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(_signum, _stopped_while_starting)

import warnings  # pylint: disable=g-import-not-at-top,wrong-import-position

from absl import app
from absl import flags
from absl import logging

from experiment_driver import build
from experiment_driver import outputs
from fl_engine import runtime
from experiment_driver import training_loop
from fl_engine import scratch
import tasks
import tensorflow as tf  # pylint: disable=g-import-not-at-top

# Errors that a user's input or machine causes: one line, exit code 2.
USER_ERRORS = (ValueError, tasks.MissingDataError, outputs.CheckpointError,
               runtime.WorkerUnavailableError)
# Writing outputs failed: a full disk, an unwritable or vanished directory
# (TensorFlow's file API raises its own errors for the same causes).
OUTPUT_ERRORS = (OSError, tf.errors.ResourceExhaustedError,
                 tf.errors.PermissionDeniedError,
                 tf.errors.FailedPreconditionError)


class Terminated(KeyboardInterrupt):
  """SIGTERM or SIGHUP, handled as Ctrl-C is."""

  def __init__(self, signum: int = signal.SIGTERM):
    super().__init__()
    self.signum = signum


def _terminate(signum, frame):
  del frame
  raise Terminated(signum)


def run() -> None:
  """Runs the experiment the flags describe."""
  build.check_flags()
  run_dir = build.run_directory()
  run_dir.check_hparams()
  run_dir.lock()
  try:
    run_dir.verify_resume()
    _train(run_dir)
  except KeyboardInterrupt as e:
    # The call in flight is abandoned: its coroutine is never awaited, which
    # Python would report at exit.
    warnings.simplefilter('ignore', RuntimeWarning)
    done = (f'at round {run_dir.last_round}' if run_dir.last_round else
            'before its first round')
    checkpoint = ('' if run_dir.last_checkpoint_round is None else
                  f' (last checkpoint: round {run_dir.last_checkpoint_round})')
    what = 'interrupted'
    if isinstance(e, Terminated):
      what = 'hung up (SIGHUP)' if e.signum == signal.SIGHUP else 'terminated'
    print(f'{what} {done}{checkpoint}; rerun the same command to resume',
          file=sys.stderr)
    sys.exit(128 + (e.signum if isinstance(e, Terminated) else
                    signal.SIGINT))
  except OUTPUT_ERRORS as e:
    what = (f'{e.filename}: {e.strerror}' if isinstance(e, OSError) and
            e.filename else str(getattr(e, 'message', e)).split('\n')[0])
    print(f'error: cannot write the run\'s outputs ({what}); free space or'
          ' fix the directory, then rerun the same command to resume',
          file=sys.stderr)
    sys.exit(2)
  finally:
    run_dir.unlock()


def _train(run_dir: outputs.RunDirectory) -> None:
  with build.runtime() as where:
    task = build.create_task()
    ctx = build.build_context(task)
    setup = build.build_algorithm(ctx)
    print(f'run directory: {run_dir.path}', flush=True)
    print(f'runtime: {build.describe_runtime(where)}', flush=True)
    if setup.execution:
      print(f'rounds run on: {setup.execution}', flush=True)
    final_metrics = training_loop.run_training(
        setup, task, run_dir,
        build.loop_config(task, print_fn=lambda line: print(line, flush=True)))
    if setup.finish_fn is not None:
      setup.finish_fn(run_dir.path)
  print(f'metrics:     {run_dir.metrics_csv}')
  print(f'tensorboard: {run_dir.tensorboard_dir}')
  for key in ('validation/accuracy', 'test/accuracy'):
    if key in final_metrics:
      print(f'final {key}: {final_metrics[key]:.4f}')


def main(argv) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {" ".join(argv[1:])}')
  if not flags.FLAGS['verbosity'].present:  # --verbosity brings logs back
    logging.set_verbosity(logging.WARNING)
  # `bazel run` starts the program in its runfiles directory; relative paths
  # in flags are meant from where the user typed the command.
  os.chdir(os.environ.get('BUILD_WORKING_DIRECTORY', os.getcwd()))
  # TensorFlow's temporary files (autograph's sources) in a directory this
  # process owns: removed at exit, and by the next run after a kill -9.
  scratch.use_owned_temp_dir()
  signal.signal(signal.SIGINT, signal.default_int_handler)
  signal.signal(signal.SIGTERM, _terminate)
  signal.signal(signal.SIGHUP, _terminate)
  try:
    run()
  except outputs.RunLockedError as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(outputs.EXIT_LOCKED)
  except USER_ERRORS as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(2)


def parse_flags(argv: list[str]) -> list[str]:
  """absl's parsing, with a bad flag reported as one `error:` line, exit 2."""
  try:
    rest = flags.FLAGS(argv)
  except flags.Error as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(2)
  if len(rest) > 1:
    print(f'error: unexpected arguments: {" ".join(rest[1:])} (every setting'
          ' is a --flag; see --help)', file=sys.stderr)
    sys.exit(2)
  return rest


def entry_point() -> None:
  # Every computation runs on the runtime `build.runtime()` starts and stops;
  # TFF's own default context would also print a traceback at exit.
  runtime.refuse_unmanaged_default_context()
  app.run(main, flags_parser=parse_flags)


if __name__ == '__main__':
  entry_point()
