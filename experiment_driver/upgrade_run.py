"""Converts a run directory written by an earlier version, once, explicitly.

    python -m experiment_driver.upgrade_run RUN_DIR [RUN_DIR ...]

A resume verifies that a stateful run's checkpoint resumes exactly the
client states it was saved with (`experiment_driver.outputs`). Runs made
before the manifest recorded that binding (no `run_id`, checkpoints without
`client_states`, a client-state store of `.npz` files or without an owner)
are refused with a line naming this command. It gives the run its identity,
converts its store (`fl_engine.client_state_store.upgrade`, which adopts the
state files it finds: use it on a run directory you know to be intact), and
records in each checkpoint the summary of the states it resumes. Every step
is printed; the store's manifest logs the conversion (`upgraded`). A run
directory that needs nothing is left untouched.
"""

import os
import sys

from absl import app

from experiment_driver import run_files
from fl_engine import client_state_store
from fl_common import run_layout


def upgrade_run(path: str, print_fn=print) -> list[str]:
  """Converts the run directory `path` (module docstring).

  Returns:
    The steps taken.

  Raises:
    run_files.RunFileError: If the run's manifest is missing or damaged.
    client_state_store.ClientStateError: If its store cannot be converted.
  """
  manifest = run_files.Manifest(path)
  if not manifest.exists:
    raise run_files.RunFileError(
        f'{manifest.path} is missing: {path} is not a run directory this'
        ' package can convert')
  manifest.read()
  steps = []
  if manifest.run_id is None:
    manifest.new_run_id()
    steps.append(f'gave the run its identity {manifest.run_id}')
  states_dir = os.path.join(path, run_layout.CLIENT_STATES_DIR)
  if os.path.isdir(states_dir):
    steps += client_state_store.upgrade(states_dir, manifest.run_id,
                                        print_fn=lambda _: None)
    digests = client_state_store.recorded_digests(states_dir)
    for round_num, record in sorted(manifest.checkpoints.items()):
      summary = client_state_store.summary_of(round_num, digests)
      if record.get('client_states') != summary:
        record['client_states'] = summary
        steps.append(f'bound checkpoint {round_num} to its'
                     f' {summary["count"]} client states')
  for step in steps:
    print_fn(f'{path}: {step}')
  if steps:
    manifest.write()
  return steps


def main(argv):
  if len(argv) < 2:
    raise app.UsageError('usage: python -m experiment_driver.upgrade_run'
                         ' RUN_DIR [RUN_DIR ...]')
  for path in argv[1:]:
    try:
      if not upgrade_run(path):
        print(f'{path}: nothing to convert')
    except (run_files.RunFileError, client_state_store.ClientStateError,
            OSError) as e:
      print(f'error: {e}', file=sys.stderr)
      return 2
  return 0


if __name__ == '__main__':
  app.run(main)
