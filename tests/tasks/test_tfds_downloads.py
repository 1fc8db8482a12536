"""The TFDS image datasets (EMNIST-L, CIFAR-10, CIFAR-100) fetched on first
use through a loopback mirror: the source archive is downloaded, checked,
kept where TFDS's builder finds it, and prepared; a cut download resumes; a
wrong or truncated archive is one line; `prepare_data` and the driver use
the prepared data offline.

The mirror (127.0.0.1) serves small archives generated here in the sources'
own formats (CIFAR's binary version). TFDS registers the real archives'
sizes and digests (and checks a manual download against them), so the tests
register the generated ones' instead (`DatasetBuilder.url_infos`);
everything else is the code users run.
"""

import hashlib
import io
import os
import subprocess
import sys
import tarfile

import numpy as np
import pytest
import tensorflow_datasets as tfds
from tensorflow_datasets.core.download import checksums

from tasks import centralized_images
from tasks import data_files
from tasks import errors
from tests import loopback_mirror
from tests import run_directories

_ORIGINS = {
    'cifar10': 'https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz',
    'cifar100': 'https://www.cs.toronto.edu/~kriz/cifar-100-binary.tar.gz',
}


def _cifar_archive(name: str, num_train: int, num_test: int, seed: int = 0):
  """`(archive bytes, train labels)` in CIFAR's binary format: per record
  the label byte(s) and 3,072 image bytes (CIFAR-100: coarse, then fine)."""
  rng = np.random.default_rng(seed)
  num_classes = 10 if name == 'cifar10' else 100

  def records(n):
    labels = rng.integers(0, num_classes, n).astype(np.uint8)
    images = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
    columns = [labels[:, None], images]
    if name == 'cifar100':
      columns.insert(0, (labels // 5)[:, None])
    return np.concatenate(columns, axis=1).tobytes(), labels

  if name == 'cifar10':
    prefix = 'cifar-10-batches-bin/'
    train_parts = [records(num_train // 5) for _ in range(5)]
    files = {f'data_batch_{i + 1}.bin': part[0]
             for i, part in enumerate(train_parts)}
    train_labels = np.concatenate([part[1] for part in train_parts])
    files['test_batch.bin'] = records(num_test)[0]
    files['batches.meta.txt'] = '\n'.join(
        f'class{i}' for i in range(10)).encode()
  else:
    prefix = 'cifar-100-binary/'
    train, train_labels = records(num_train)
    files = {'train.bin': train, 'test.bin': records(num_test)[0],
             'coarse_label_names.txt': '\n'.join(
                 f'coarse{i}' for i in range(20)).encode(),
             'fine_label_names.txt': '\n'.join(
                 f'fine{i}' for i in range(100)).encode()}
  buffer = io.BytesIO()
  with tarfile.open(fileobj=buffer, mode='w:gz') as archive:
    for file_name, content in files.items():
      member = tarfile.TarInfo(prefix + file_name)
      member.size = len(content)
      archive.addfile(member, io.BytesIO(content))
  return buffer.getvalue(), train_labels


def _register(monkeypatch, name, archive):
  """Registers `archive` as the dataset's published source."""
  filename = os.path.basename(_ORIGINS[name])
  info = checksums.UrlInfo(size=len(archive),
                           checksum=hashlib.sha256(archive).hexdigest(),
                           filename=filename)
  monkeypatch.setattr(tfds.core.DatasetBuilder, 'url_infos',
                      {_ORIGINS[name]: info})
  return filename


@pytest.fixture
def served(tmp_path, monkeypatch):
  """`(base URL, served directory, handler class)`, downloads enabled."""
  directory = tmp_path / 'served'
  directory.mkdir()
  with loopback_mirror.serve(directory) as (url, handler):
    monkeypatch.setenv(data_files.MIRROR_ENV, url)
    monkeypatch.setenv(data_files.OFFLINE_ENV, '0')
    yield url, directory, handler


@pytest.mark.parametrize('name', ['cifar10', 'cifar100'])
def test_first_use_downloads_prepares_then_reads_offline(
    name, served, tmp_path, monkeypatch):
  _, directory, handler = served
  archive, train_labels = _cifar_archive(name, num_train=50, num_test=10)
  filename = _register(monkeypatch, name, archive)
  (directory / filename).write_bytes(archive)
  data_dir = tmp_path / 'tfds'
  train, test = centralized_images.load_image_dataset(
      name, data_dir=str(data_dir))
  assert [path for path, _ in handler.requests] == [f'/{filename}']
  assert train.x.shape == (50, 32, 32, 3) and test.x.shape == (10, 32, 32, 3)
  np.testing.assert_array_equal(np.sort(train.y), np.sort(train_labels))
  manual = data_dir / 'downloads' / 'manual'
  assert os.listdir(manual) == [filename]
  assert (manual / filename).read_bytes() == archive
  # Prepared: the second run needs neither the network nor the archive.
  monkeypatch.setenv(data_files.OFFLINE_ENV, '1')
  (manual / filename).unlink()
  again, _ = centralized_images.load_image_dataset(name, data_dir=str(data_dir))
  np.testing.assert_array_equal(again.y, train.y)
  assert len(handler.requests) == 1


def test_a_cut_download_prepares_nothing_and_the_rerun_resumes(
    served, tmp_path, monkeypatch):
  _, directory, handler = served
  archive, _ = _cifar_archive('cifar10', num_train=50, num_test=10)
  filename = _register(monkeypatch, 'cifar10', archive)
  (directory / filename).write_bytes(archive)
  handler.cut_after = 5000
  data_dir = tmp_path / 'tfds'
  with pytest.raises(errors.MissingDataError) as raised:
    centralized_images.load_image_dataset('cifar10', data_dir=str(data_dir))
  assert 'cut short at 5000 of' in str(raised.value)
  assert '\n' not in str(raised.value)
  manual = data_dir / 'downloads' / 'manual'
  assert os.listdir(manual) == [filename + '.part']
  assert not (data_dir / 'cifar10').exists()
  handler.cut_after = None
  train, _ = centralized_images.load_image_dataset(
      'cifar10', data_dir=str(data_dir))
  assert handler.requests[-1][1] == 'bytes=5000-'  # resumed, not restarted
  assert (manual / filename).read_bytes() == archive
  assert train.x.shape[0] == 50


def test_a_mirror_serving_other_bytes_leaves_nothing(
    served, tmp_path, monkeypatch):
  _, directory, _ = served
  archive, _ = _cifar_archive('cifar10', num_train=50, num_test=10)
  filename = _register(monkeypatch, 'cifar10', archive)
  (directory / filename).write_bytes(archive[:-1] + b'x')
  data_dir = tmp_path / 'tfds'
  with pytest.raises(data_files.CorruptDataError) as raised:
    centralized_images.load_image_dataset('cifar10', data_dir=str(data_dir))
  assert 'sha256 is not the published one' in str(raised.value)
  assert not os.listdir(data_dir / 'downloads' / 'manual')
  assert not (data_dir / 'cifar10').exists()


def test_a_truncated_archive_in_place_is_one_line_naming_it(
    tmp_path, monkeypatch):
  archive, _ = _cifar_archive('cifar10', num_train=50, num_test=10)
  filename = _register(monkeypatch, 'cifar10', archive)
  manual = tmp_path / 'downloads' / 'manual'
  manual.mkdir(parents=True)
  (manual / filename).write_bytes(archive[:len(archive) // 2])
  with pytest.raises(data_files.CorruptDataError) as raised:
    centralized_images.load_image_dataset('cifar10', data_dir=str(tmp_path))
  message = str(raised.value)
  assert '\n' not in message and str(manual / filename) in message
  assert 'delete it' in message
  assert not (tmp_path / 'cifar10').exists()


def test_prepare_data_then_the_driver_trains_offline(served, tmp_path):
  url, directory, handler = served
  archive, _ = _cifar_archive('cifar10', num_train=100, num_test=20)
  (directory / 'cifar-10-binary.tar.gz').write_bytes(archive)
  data_dir = tmp_path / 'tfds'
  # prepare_data's own main, with the generated archive registered.
  script = (
      'import hashlib, sys\n'
      'from tasks import prepare_data\n'
      'import tensorflow_datasets as tfds\n'
      'from tensorflow_datasets.core.download import checksums\n'
      f'archive = open({str(directory / "cifar-10-binary.tar.gz")!r},'
      ' "rb").read()\n'
      'info = checksums.UrlInfo(size=len(archive), checksum=hashlib.sha256('
      'archive).hexdigest(), filename="cifar-10-binary.tar.gz")\n'
      'tfds.core.DatasetBuilder.url_infos = {'
      f'{_ORIGINS["cifar10"]!r}: info}}\n'
      'sys.exit(prepare_data.main(["--task=cifar10",'
      f' "--data_dir={data_dir}"]))\n')
  env = {**os.environ, data_files.MIRROR_ENV: url, data_files.OFFLINE_ENV: '0'}
  result = subprocess.run([sys.executable, '-c', script], capture_output=True,
                          text=True, cwd=run_directories.REPO, env=env,
                          timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.strip() == f'cifar10: {data_dir}'
  assert len(handler.requests) == 1
  run_directories.run_driver(
      '--task=cifar10', f'--data_dir={data_dir}', '--num_clients=4',
      '--clients_per_round=2', '--total_rounds=1', '--rounds_per_eval=1',
      f'--root_output_dir={tmp_path / "runs"}', '--experiment_name=c',
      '--offline')
  metrics = run_directories.read_metrics(str(tmp_path / 'runs' / 'c'))
  assert list(metrics['round']) == [1]
  assert len(handler.requests) == 1
