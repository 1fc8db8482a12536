"""A run directory: hyperparameters, per-round metrics, TensorBoard, checkpoints.

Layout of `<root_output_dir>/<experiment_name>/`:

    hparams.json     the flags of the run (rerunning with other flags is refused)
    metrics.csv      one row per round (`tff.program.CSVFileReleaseManager`)
    tensorboard/     scalars per round (`tff.program.TensorBoardReleaseManager`)
    checkpoints/     program state (`tff.program.FileProgramStateManager`)

Metrics are released through TFF's program release managers; the CSV manager
drops rows past the resumed round itself, so a resumed run's CSV equals an
uninterrupted run's.
"""

import asyncio
import json
import math
import os
import tempfile
from collections.abc import Mapping
from typing import Any

import tensorflow_federated as tff


class RunDirectoryError(ValueError):
  """The run directory cannot be used as asked."""


class CheckpointError(RuntimeError):
  """A saved checkpoint cannot be read."""


def _write_atomically(path: str, text: str) -> None:
  directory = os.path.dirname(path)
  with tempfile.NamedTemporaryFile('w', dir=directory, delete=False) as f:
    f.write(text)
  os.replace(f.name, path)


class RunDirectory:
  """Owns one run's outputs; writes nothing until `start_writing()`."""

  def __init__(self, root_output_dir: str, experiment_name: str,
               hparams: Mapping[str, Any]):
    self.path = os.path.join(root_output_dir, experiment_name)
    self.hparams = dict(hparams)
    self.metrics_csv = os.path.join(self.path, 'metrics.csv')
    self.tensorboard_dir = os.path.join(self.path, 'tensorboard')
    self.checkpoint_dir = os.path.join(self.path, 'checkpoints')
    self.hparams_json = os.path.join(self.path, 'hparams.json')
    self._loop = asyncio.get_event_loop()
    self._release_managers = []
    self._state_manager = None  # creates its directory: made on first use

  def _checkpoints(self) -> tff.program.FileProgramStateManager:
    if self._state_manager is None:
      self._state_manager = tff.program.FileProgramStateManager(
          self.checkpoint_dir, keep_total=2)
    return self._state_manager

  def check_hparams(self) -> None:
    """Refuses to resume a run that was started with other hyperparameters."""
    if not os.path.exists(self.hparams_json):
      return
    hparams = self.hparams
    with open(self.hparams_json) as f:
      saved = json.load(f)
    changed = sorted(k for k in set(saved) | set(hparams)
                     if saved.get(k) != hparams.get(k))
    if changed:
      details = ', '.join(
          f'{k}: {saved.get(k)!r} -> {hparams.get(k)!r}' for k in changed)
      raise RunDirectoryError(
          f'{self.path} holds a run with other flags ({details}); pass another'
          ' --experiment_name or the same flags to resume it')

  def start_writing(self) -> None:
    """Creates the directory, writes the hyperparameters, opens the writers.

    Called after the checkpoint was read, so a run that cannot resume leaves
    its directory untouched.
    """
    os.makedirs(self.path, exist_ok=True)
    _write_atomically(self.hparams_json,
                      json.dumps(self.hparams, indent=2, sort_keys=True))
    self._release_managers = [
        tff.program.CSVFileReleaseManager(
            self.metrics_csv,
            save_mode=tff.program.CSVSaveMode.APPEND,
            key_fieldname='round'),
        tff.program.TensorBoardReleaseManager(self.tensorboard_dir),
    ]

  def release_metrics(self, metrics: Mapping[str, float], round_num: int):
    """Writes one round's flat metrics to the CSV and TensorBoard."""
    self._loop.run_until_complete(asyncio.gather(*[
        manager.release(dict(metrics), key=round_num)
        for manager in self._release_managers
    ]))

  def save_checkpoint(self, program_state: Any, round_num: int) -> None:
    self._loop.run_until_complete(
        self._checkpoints().save(program_state, round_num))

  def load_latest_checkpoint(self, structure: Any) -> tuple[Any, int]:
    """Returns `(program_state, round)` or `(None, 0)` if there is none."""
    if not os.path.isdir(self.checkpoint_dir):
      return None, 0
    try:
      state, version = self._loop.run_until_complete(
          self._checkpoints().load_latest(structure))
    except Exception as e:  # pylint: disable=broad-except
      versions = self._loop.run_until_complete(
          self._checkpoints().get_versions())
      raise CheckpointError(
          f'checkpoint {self.checkpoint_dir}/program_state_'
          f'{max(versions or [0])} cannot be read'
          f' ({type(e).__name__}); delete it to resume from the one before, or'
          ' pass another --experiment_name') from e
    return (state, version) if state is not None else (None, 0)


def flatten_metrics(structure: Any, prefix: str = '') -> dict[str, float]:
  """Flattens nested TFF metrics to `{'a/b/c': float}` (scalars only)."""
  flat = {}
  if isinstance(structure, Mapping):
    items = structure.items()
  elif hasattr(structure, '_asdict'):
    items = structure._asdict().items()
  else:
    try:
      return {prefix: float(structure)}
    except (TypeError, ValueError):
      return {}
  for key, value in items:
    flat.update(flatten_metrics(value, f'{prefix}/{key}' if prefix else key))
  return flat


def format_duration(seconds: float) -> str:
  seconds = int(round(seconds))
  hours, rest = divmod(seconds, 3600)
  minutes, seconds = divmod(rest, 60)
  return f'{hours}h{minutes:02d}m{seconds:02d}s' if hours else (
      f'{minutes}m{seconds:02d}s')


def progress_line(round_num: int, total_rounds: int, round_seconds: float,
                  mean_round_seconds: float,
                  metrics: Mapping[str, float]) -> str:
  """One line per round: round, time, ETA and the key metrics."""
  eta = mean_round_seconds * (total_rounds - round_num)
  parts = [f'round {round_num}/{total_rounds}', f'{round_seconds:.2f}s',
           f'ETA {format_duration(eta)}']
  for key in ('train/loss', 'train/accuracy', 'validation/accuracy',
              'test/accuracy', 'update_norm', 'clipping_norm'):
    value = metrics.get(key)
    if value is not None and not (isinstance(value, float) and math.isnan(value)):
      parts.append(f'{key} {value:.4g}')
  for key in ('num_nonfinite_updates', 'num_zero_updates'):
    if metrics.get(key, 0) > 0:  # diverged clients, discarded (diagnostics)
      parts.append(f'{key} {int(metrics[key])}')
  return ' | '.join(parts)
