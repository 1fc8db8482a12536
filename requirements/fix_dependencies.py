"""The fixes that the supported stack needs in third-party packages.

    python requirements/fix_dependencies.py apply   # `make install` runs it
    python requirements/fix_dependencies.py check   # exit 1 if one is missing

TFF 0.87.0 (its last release) and TensorFlow Privacy 0.9.0 (which TFF imports
at `import tensorflow_federated`) predate Python 3.12 and TensorFlow 2.16.
Each fix below is a literal text replacement in one installed file: the
installer applies it once, right after `pip install`, and prints what it
changed; nothing is edited at run time. A fix whose original text is not in
the file (another version of the package) is an error, never a guess. Drop a
fix when its upstream issue is fixed in a release the lock file pins.

Every fixed line carries the marker `fl-papers-tff fix`, so `grep -rn` in
site-packages shows them all.
"""

import dataclasses
import importlib.util
import os
import sys

MARKER = 'fl-papers-tff fix'


@dataclasses.dataclass(frozen=True)
class Fix:
  """Replaces `old` with `new` in `package`'s file `path`."""
  package: str
  path: str
  old: str
  new: str
  why: str
  upstream: str


_ESTIMATOR_CHECK = (
    f'  # {MARKER}: v1 and the estimators import tensorflow_estimator,\n'
    '  # which TensorFlow >= 2.16 no longer ships (tensorflow/privacy#557).\n'
    '  import importlib.util as _fl_papers_util\n'
    "  _fl_papers_estimator = _fl_papers_util.find_spec('tensorflow_estimator')\n"
)

FIXES = (
    Fix(
        package='tensorflow_privacy',
        path='__init__.py',
        old='  # TensorFlow v1 imports\n  from tensorflow_privacy import v1\n',
        new=('  # TensorFlow v1 imports\n' + _ESTIMATOR_CHECK +
             '  if _fl_papers_estimator is not None:\n'
             '    from tensorflow_privacy import v1\n'),
        why=('`import tensorflow_federated` imports tensorflow_privacy, whose'
             ' __init__ imports its Estimator classes; tensorflow_estimator is'
             ' gone since TF 2.16. TFF uses only its DP queries.'),
        upstream='https://github.com/tensorflow/privacy/issues/557',
    ),
    Fix(
        package='tensorflow_privacy',
        path='__init__.py',
        old=('  # Estimators\n'
             '  from tensorflow_privacy.privacy.estimators.dnn import'
             ' DNNClassifier\n'),
        new=('  # Estimators\n'
             f'  if _fl_papers_estimator is not None:  # {MARKER}\n'
             '    from tensorflow_privacy.privacy.estimators.dnn import'
             ' DNNClassifier\n'),
        why='The same: DNNClassifier is a tf.estimator.Estimator.',
        upstream='https://github.com/tensorflow/privacy/issues/557',
    ),
    Fix(
        package='tensorflow_federated',
        path='python/simulation/baselines/emnist/emnist_models.py',
        old='      base_seed = random.randint(1, 1e9)\n',
        new=f'      base_seed = random.randint(1, int(1e9))  # {MARKER}\n',
        why=('random.randint refuses a float bound on Python >= 3.12: TFF\'s'
             ' EMNIST baseline models (the emnist task) raise TypeError.'),
        upstream=('none in TFF (0.87.0 is its last release); the same bug in'
                  ' tf_keras: https://github.com/keras-team/tf-keras/issues/803'),
    ),
    Fix(
        package='tensorflow_federated',
        path='python/simulation/models/mnist.py',
        old='      base_seed = random.randint(1, 1e9)\n',
        new=f'      base_seed = random.randint(1, int(1e9))  # {MARKER}\n',
        why='The same, in TFF\'s MNIST models.',
        upstream='as above',
    ),
)


class FixError(Exception):
  """A fix's file is missing, or holds neither its original nor fixed text."""


def package_dir(package: str) -> str:
  """The installed package's directory, found without importing it."""
  spec = importlib.util.find_spec(package)
  if spec is None or not spec.submodule_search_locations:
    raise FixError(f'{package} is not installed')
  return list(spec.submodule_search_locations)[0]


def _file(fix: Fix, root: str | None) -> str:
  base = os.path.join(root, fix.package) if root else package_dir(fix.package)
  return os.path.join(base, fix.path)


def status(fix: Fix, root: str | None = None) -> bool:
  """True if `fix` is applied, False if it is due; FixError otherwise."""
  path = _file(fix, root)
  try:
    with open(path, encoding='utf-8') as f:
      text = f.read()
  except OSError as e:
    raise FixError(f'{path}: {e.strerror}') from e
  if fix.new in text:
    return True
  if text.count(fix.old) == 1:
    return False
  raise FixError(
      f'{path} holds neither the original nor the fixed text of this fix'
      f' (another {fix.package} version than requirements/ pins?)')


def apply(fix: Fix, root: str | None = None) -> bool:
  """Applies `fix` unless it is applied; True if the file changed."""
  if status(fix, root):
    return False
  path = _file(fix, root)
  with open(path, encoding='utf-8') as f:
    text = f.read()
  tmp = path + '.fl-papers-tmp'
  with open(tmp, 'w', encoding='utf-8') as f:
    f.write(text.replace(fix.old, fix.new, 1))
  os.replace(tmp, path)
  return True


def main(argv: list[str]) -> int:
  if len(argv) != 2 or argv[1] not in ('apply', 'check'):
    print(f'error: usage: {argv[0]} apply|check', file=sys.stderr)
    return 2
  root = os.environ.get('FL_PAPERS_FIX_ROOT')  # tests: a copy of the files
  try:
    if argv[1] == 'check':
      due = [fix for fix in FIXES if not status(fix, root)]
      for fix in due:
        print(f'error: not applied: {fix.package}/{fix.path}: {fix.why}',
              file=sys.stderr)
      return 1 if due else 0
    for fix in FIXES:
      if apply(fix, root):
        print(f'fixed {fix.package}/{fix.path} ({fix.upstream})')
  except FixError as e:
    print(f'error: {e}', file=sys.stderr)
    return 1
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv))
