"""Downloads and checks a task's data without training.

    python -m tasks.prepare_data --task=emnist [--data_dir=DIR]
    python -m tasks.prepare_data --task=all --data_dir=DIR

Fetches the files the task reads (`tasks.data_files`: atomically, checked,
resumed after an interruption; the TFDS datasets are also prepared by TFDS,
`tasks.centralized_images`) and prints where they are: copy that to an
offline cluster or to the machines of `--worker_addresses`, and pass
`--data_dir` there. Tasks whose data are generated or bundled need nothing.
Bad input is one `error:` line and exit code 2.
"""

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Optional

import tqdm

import tasks
from tasks import centralized_images
from tasks import data_files

# The files each downloading task's loader reads, as (name, TFF or Keras
# cache) pairs, with the loader calls that would fetch them.
_FILES = {
    'emnist': ('EMNIST', [('emnist_all.sqlite', 'tff')],
               'tff.simulation.datasets.emnist.load_data(cache_dir=DIR)'),
    'shakespeare': ('Shakespeare', [('shakespeare.sqlite', 'tff')],
                    'tff.simulation.datasets.shakespeare.load_data('
                    'cache_dir=DIR)'),
    'stackoverflow': ('Stack Overflow',
                      [('stackoverflow.sqlite', 'tff'),
                       ('stackoverflow.word_count.tar.bz2', 'keras')],
                      'tff.simulation.datasets.stackoverflow.load_data('
                      'cache_dir=DIR)'),
    'cifar100': ('CIFAR-100', [('cifar100.sqlite', 'tff')],
                 'tff.simulation.datasets.cifar100.load_data(cache_dir=DIR)'),
}


def data_paths(task_name: str, data_dir: Optional[str]) -> list[str]:
  """Where the loader of `task_name` reads its files ([] if it reads none)."""
  if task_name not in _FILES:
    return []
  return [data_files.tff_cached_path(name, data_dir) if cache == 'tff' else
          data_files.keras_cached_path(name, data_dir)
          for name, cache in _FILES[task_name][1]]


def prepare(task_name: str, data_dir: Optional[str]) -> list[str]:
  """Fetches and checks the task's files; returns their paths (for a TFDS
  dataset, TFDS's data directory).

  Raises:
    tasks.MissingDataError: A file cannot be downloaded or is not whole.
  """
  record = tasks.TASKS[task_name]
  if not record.reads_files:
    return []
  if record.prepare is not None:
    return record.prepare(data_dir)
  if record.partitioned:
    return [centralized_images.prepare_image_dataset(
        record.partition_of, data_dir=data_dir)]
  dataset_name, _, loader_call = _FILES[task_name]
  paths = data_paths(task_name, data_dir)
  with data_files.require_cached_files(dataset_name, paths, loader_call):
    pass
  return paths


def _size(path: str) -> str:
  return tqdm.tqdm.format_sizeof(os.path.getsize(path), 'B', 1024)


def main(argv: Sequence[str]) -> int:
  parser = argparse.ArgumentParser(
      prog='python -m tasks.prepare_data',
      description=__doc__.split('\n\n')[0])
  parser.add_argument('--task', required=True,
                      choices=(*tasks.TASK_NAMES, 'all'))
  parser.add_argument('--data_dir', default=None,
                      help='Where the files go (default: TFF\'s ~/.tff;'
                      ' TFDS\'s ~/tensorflow_datasets for its datasets).')
  parser.add_argument('--noprogress', action='store_true',
                      help='No progress bar.')
  args = parser.parse_args(argv)
  data_files.configure(progress=not args.noprogress)
  names = ([n for n in tasks.TASK_NAMES if tasks.TASKS[n].downloads]
           if args.task == 'all' else [args.task])
  try:
    for name in names:
      paths = prepare(name, args.data_dir)
      if not paths:
        print(f'{name}: nothing to prepare (its data are generated or'
              ' bundled)')
      for path in paths:
        print(f'{name}: {path}' + (f' ({_size(path)})' if os.path.isfile(path)
                                   else ''))
  except (tasks.MissingDataError, ValueError) as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  return 0


if __name__ == '__main__':
  status = main(sys.argv[1:])
  # Importing TFF installs its default context, whose destructor fails
  # noisily at interpreter exit; nothing is left to clean up here.
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(status)  # pylint: disable=protected-access
