#!/bin/sh
# Installs the supported stack into a virtual environment (`make install`).
#
#   requirements/install.sh VENV      # PYTHON=..., GPU=1: see below
#
# Python: PYTHON if set (a command or a path; a pyenv-installed version is
# found by its name, e.g. python3.12, even when pyenv has not selected it),
# else VENV's own Python if VENV exists, else the first of python3,
# python3.13, python3.12, python3.11 that is 3.11-3.13.
# The stack: requirements/lock.txt, the exact set tested on 3.11-3.13,
# installed with --no-deps (TFF 0.87.0 declares jax==0.4.14, whose wheels are
# gone, and Python < 3.12), then the fixes of requirements/fix_dependencies.py,
# then this package in editable mode. GPU=1 replaces the lock's CPU-only
# TensorFlow by the CUDA 12 build, `tensorflow[and-cuda]` of the same version.
# VENV/.installed records what was installed; a different Python, lock or GPU
# setting rebuilds VENV from scratch, and the same one returns at once.
set -eu

venv=${1:-.venv}
here=$(cd "$(dirname "$0")" && pwd)
supported="3.11 3.12 3.13"
gpu=${GPU:-0}
case $gpu in 0|1) ;; *) echo "error: GPU=$gpu: use GPU=1 or GPU=0" >&2; exit 2;; esac

version_of() {
  "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null
}

# A runnable interpreter for $1: itself, or for a bare name, pyenv's copy.
resolve() {
  if version_of "$1" >/dev/null; then echo "$1"; return 0; fi
  case $1 in */*) return 1;; esac  # a path is taken as it is
  if command -v pyenv >/dev/null 2>&1; then
    for candidate in "$(pyenv root)"/versions/*/bin/"$(basename "$1")"; do
      if version_of "$candidate" >/dev/null; then echo "$candidate"; return 0; fi
    done
  fi
  return 1
}

supported_version() {
  case " $supported " in *" $1 "*) return 0;; esac
  return 1
}

if [ -n "${PYTHON:-}" ]; then
  python=$(resolve "$PYTHON") || {
    echo "error: PYTHON=$PYTHON is not a runnable Python; this package needs Python 3.11, 3.12 or 3.13" >&2
    exit 2
  }
  version=$(version_of "$python")
  supported_version "$version" || {
    echo "error: PYTHON=$PYTHON is Python $version; this package needs Python 3.11, 3.12 or 3.13" >&2
    exit 2
  }
elif [ -x "$venv/bin/python" ] && supported_version "$(version_of "$venv/bin/python")"; then
  # The interpreter VENV was made from: a rebuild deletes VENV's own.
  python=$("$venv/bin/python" -c 'import sys; print(sys._base_executable)')
  version=$(version_of "$python")
else
  python=""
  for name in python3 python3.13 python3.12 python3.11; do
    candidate=$(resolve "$name") || continue
    if supported_version "$(version_of "$candidate")"; then python=$candidate; break; fi
  done
  [ -n "$python" ] || {
    echo "error: no Python 3.11, 3.12 or 3.13 found (tried python3, python3.13, python3.12, python3.11 and pyenv); install one or pass PYTHON=/path/to/python3.X" >&2
    exit 2
  }
  version=$(version_of "$python")
fi

# What this install is: the Python, the GPU setting and every file it reads.
want="python=$version gpu=$gpu $(cat "$here/lock.txt" "$here/fix_dependencies.py" "$here/install.sh" "$here/../setup.py" | cksum | cut -d' ' -f1)"
stamp=$venv/.installed
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then exit 0; fi

if [ -e "$venv" ]; then
  echo "rebuilding $venv for Python $version (gpu=$gpu): it was installed for another Python, lock or GPU setting"
  rm -rf "$venv"
else
  echo "installing into $venv: Python $version, gpu=$gpu (a few minutes)"
fi
# An interrupted install leaves no stamp: the next one starts from scratch.
"$python" -m venv "$venv"
py=$venv/bin/python
pip="$py -m pip --quiet --quiet --disable-pip-version-check"
$pip install --no-deps --ignore-requires-python -r "$here/lock.txt"
if [ "$gpu" = 1 ]; then
  tf_version=$(sed -n 's/^tensorflow[-_]cpu==//p' "$here/lock.txt")
  $pip uninstall --yes tensorflow-cpu
  $pip install --constraint "$here/lock.txt" "tensorflow[and-cuda]==$tf_version"
fi
$py "$here/fix_dependencies.py" apply >/dev/null
$pip install --no-deps -e "$here/.."
echo "$want" > "$stamp"
echo "installed: $venv (Python $version$( [ "$gpu" = 1 ] && echo ', TensorFlow for CUDA 12'))"
