"""Exits 1 unless every metrics.csv equals the first, timing columns aside.

    python .ci/same_metrics.py REFERENCE.csv OTHER.csv [...]

`make demo` on each supported Python runs the same graphs on the same TFF
worker with the same seeds: its metrics are expected bit for bit equal
(measured so on 3.11, 3.12 and 3.13), so the tolerance is zero.
"""

import sys

import pandas as pd

# fl_common.run_layout.TIMING_COLUMNS, spelled here: this script imports
# only pandas (the package would import TensorFlow).
_TIMING = ('round_time_sec', 'eval_time_sec', 'cohort_eval_time_sec')


def main(paths: list[str]) -> int:
  reference = pd.read_csv(paths[0])
  failed = False
  for path in paths[1:]:
    other = pd.read_csv(path)
    if list(other.columns) != list(reference.columns) or len(other) != len(
        reference):
      print(f'CI: {path}: other columns or rows than {paths[0]}',
            file=sys.stderr)
      failed = True
      continue
    columns = [c for c in reference.columns if c not in _TIMING]
    differ = [c for c in columns
              if not reference[c].equals(other[c])]
    if differ:
      print(f'CI: {path} differs from {paths[0]} in {differ}', file=sys.stderr)
      failed = True
    else:
      print(f'same metrics: {path} ({len(columns)} columns x {len(other)}'
            ' rounds)')
  return 1 if failed else 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
