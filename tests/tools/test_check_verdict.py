"""`tools/check_verdict.py` re-derives the committed reports' numbers.

A second implementation of the verdict rules, written from the protocols
and `docs/verdicts.md` and importing nothing of the package, run on the
committed run archives: every effect it can compute must equal the one its
report prints (mean difference, interval, corrected p-value), at the
report's printed precision. A report whose selection of runs, pairing,
quantity, test or correction drifted from what its protocol and the rules
say fails here, as does a report regenerated from other runs than its
archive holds.
"""

import importlib.util
import io
import math
import os
import re
import tarfile

import pytest

# The source tree, not Bazel's runfiles: the reports and their archives are
# read where they are committed (runfiles are links into it).
_SOURCE_REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.realpath(__file__))))
_SPEC = importlib.util.spec_from_file_location(
    'check_verdict', os.path.join(_SOURCE_REPO, 'tools', 'check_verdict.py'))
check_verdict = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(check_verdict)

_RESULTS = os.path.join(_SOURCE_REPO, 'results')
_CONFIRMATORY = re.compile(r'^\*\*Verdict:\*\* (?!INCOMPLETE)[A-Z ]+ '
                           r'\(confirmatory\)', re.M)


def _confirmatory_reports() -> list[tuple[str, str]]:
  """(paper, experiment) of each report with a confirmatory verdict and
  the archive of its runs."""
  found = []
  for paper in sorted(os.listdir(_RESULTS)):
    for experiment in sorted(os.listdir(os.path.join(_RESULTS, paper))
                             if os.path.isdir(os.path.join(_RESULTS, paper))
                             else []):
      directory = os.path.join(_RESULTS, paper, experiment)
      report = os.path.join(directory, 'README.md')
      if not (os.path.exists(os.path.join(directory,
                                          'local_confirmatory.tar.xz'))
              and os.path.exists(report)):
        continue
      with open(report) as f:
        if _CONFIRMATORY.search(f.read()):
          found.append((paper, experiment))
  return found


def _printed_effects(report: str) -> dict[str, dict[str, str]]:
  """The report's confirmatory effects table: claim -> its cells."""
  with open(report) as f:
    lines = f.read().split('## Effects (confirmatory)', 1)[1].splitlines()
  start = next(i for i, line in enumerate(lines)
               if line.startswith('| effect (paper)'))
  header = [c.strip() for c in lines[start].strip('|').split('|')]
  rows = {}
  for line in lines[start + 2:]:
    if not line.startswith('|'):
      break
    cells = dict(zip(header, (c.strip() for c in line.strip('|').split('|'))))
    rows[cells['effect (paper)']] = cells
  return rows


def _agrees(printed: str, value: float) -> bool:
  """`value` shown at the report's precision (3 significant digits,
  `verdicts._format`'s rounding to 1e-6 first) reads `printed`."""
  if printed == '—':
    return math.isnan(value)
  expected = float(printed)
  if expected == 0:
    return abs(value) < 5e-7
  half_digit = 0.5 * 10 ** (math.floor(math.log10(abs(expected))) - 2)
  return abs(value - expected) <= half_digit * (1 + 1e-9) + 5e-7


_VALUE = re.compile(r'^(\S+) \[(\S+), (\S+)\]$')

REPORTS = _confirmatory_reports()


def test_there_are_confirmatory_reports_to_check():
  # adabest table2, gel fig8 at least: the test below cannot pass empty.
  assert {('adabest', 'table2'), ('gel', 'fig8')} <= set(REPORTS)


@pytest.mark.parametrize('paper,experiment', REPORTS,
                         ids=[f'{p}-{e}' for p, e in REPORTS])
def test_each_checked_effect_is_the_reports(paper, experiment):
  printed = _printed_effects(os.path.join(_RESULTS, paper, experiment,
                                          'README.md'))
  checked = 0
  for row in check_verdict.check(paper, experiment, repo=_SOURCE_REPO):
    cells = printed[row['claim']]
    if 'not_checked' in row or row['pairs'] < 2:
      continue
    value = _VALUE.match(cells['treatment − baseline [interval]'])
    assert value, cells
    shown = dict(zip(('mean', 'low', 'high'), value.groups()))
    for key, text in shown.items():
      assert _agrees(text, row[key]), (row['claim'], key, text, row[key])
    assert int(cells['pairs'].split()[0]) == row['pairs'], row['claim']
    # The table's p column: Holm's for a primary effect, its own for a
    # secondary one; not checked where an unknown quantity is among the
    # primary effects Holm's correction runs over.
    p = row.get('p_holm', None if row['primary'] else row['p'])
    if p is not None and row['pairs'] >= check_verdict.MIN_PAIRS:
      assert _agrees(cells['p (Holm)'], p), (row['claim'], cells, p)
    checked += 1
  if (paper, experiment) in (('adabest', 'table2'), ('gel', 'fig8')):
    assert checked >= {'table2': 12, 'fig8': 2}[experiment]


def test_the_check_fails_when_the_runs_differ(tmp_path):
  # The same check on another archive (one run's final accuracy raised)
  # no longer reads the report's numbers: the comparison can fail.
  source = os.path.join(_RESULTS, 'gel', 'fig8', 'local_confirmatory.tar.xz')
  changed = str(tmp_path / 'changed.tar.xz')
  with tarfile.open(source) as old, tarfile.open(changed, 'w:xz') as new:
    done = False
    for member in old:
      data = old.extractfile(member).read() if member.isfile() else None
      if (not done and member.name.endswith('metrics.csv')
          and 'guessed_steps=infinite' in member.name):
        lines = data.decode().splitlines()
        header = lines[0].split(',')
        column = header.index(check_verdict.ACCURACY)
        for i in range(1, len(lines)):  # reaches any target in round 1
          cells = lines[i].split(',')
          if cells[column]:
            cells[column] = '1.0'
          lines[i] = ','.join(cells)
        data = ('\n'.join(lines) + '\n').encode()
        member.size = len(data)
        done = True
      new.addfile(member, None if data is None else io.BytesIO(data))
  assert done
  rows = check_verdict.check('gel', 'fig8', archive=changed,
                             repo=_SOURCE_REPO)
  printed = _printed_effects(os.path.join(_RESULTS, 'gel', 'fig8',
                                          'README.md'))
  speed_up = next(r for r in rows if 'fewer rounds' in r['claim'])
  shown = _VALUE.match(printed[speed_up['claim']][
      'treatment − baseline [interval]']).group(1)
  assert not _agrees(shown, speed_up['mean'])


def test_the_command_prints_a_line_an_effect_and_refuses_an_unknown_one(
    capsys):
  assert check_verdict.main(['gel', 'fig8']) == 0
  lines = capsys.readouterr().out.splitlines()
  assert len(lines) == 3
  assert lines[0].startswith('primary   GeL with tau\' = infinity reaches')
  assert '10 pairs' in lines[0] and 'p (Holm)' in lines[0]
  # A secondary effect: its own p, outside Holm's correction.
  assert lines[2].startswith('secondary ') and '10 pairs' in lines[2]
  assert 'p (Holm)' not in lines[2]
  assert check_verdict.main(['adabest', 'fig_easy_task']) == 0
  assert "not checked (quantity 'final ‖x‖')" in capsys.readouterr().out
  assert check_verdict.main(['gel', 'fig99']) == 2
  err = capsys.readouterr().err.splitlines()
  assert len(err) == 1 and err[0].startswith('error: ') and 'fig99' in err[0]


def test_differences_without_spread_are_decided_by_a_sign_test():
  # Five pairs, every difference +1: no t test; both sign tests exact.
  treated, base = check_verdict.np.full(5, 3.0), check_verdict.np.full(5, 2.0)
  difference = check_verdict._test({'test': 'difference'}, treated, base)
  assert difference['p'] == 2 / 2 ** 5 and difference['low'] == 1.0
  inside = check_verdict._test({'test': 'equivalence', 'margin': 2},
                               treated, base)
  assert inside['p'] == 0.5 ** 5
  outside = check_verdict._test({'test': 'equivalence', 'margin': 0.5},
                                treated, base)
  assert outside['p'] == 1.0


@pytest.mark.parametrize('both,only_t,only_b,neither', [
    (0, 5, 0, 5),    # every discordant pair one way: p = 2 / 2^5
    (2, 3, 1, 4),
    (0, 0, 0, 10),   # no discordant pair: Newcombe's interval, p = 1
    (4, 0, 0, 6),
])
def test_a_0_1_outcome_is_tested_as_the_rules_say(both, only_t, only_b,
                                                  neither):
  # Against the package's own implementation of docs/verdicts.md's 0/1
  # row (the committed reports with 0/1 outcomes are still to come).
  from reproduce import verdicts  # pylint: disable=g-import-not-at-top
  np = check_verdict.np
  treated = np.array([1] * both + [1] * only_t + [0] * only_b + [0] * neither,
                     dtype=float)
  base = np.array([1] * both + [0] * only_t + [1] * only_b + [0] * neither,
                  dtype=float)
  mine = check_verdict._test({'outcome': 'binary'}, treated, base)
  theirs = verdicts.mcnemar_test(treated, base)
  for key, value in (('mean', theirs.mean), ('low', theirs.low),
                     ('high', theirs.high), ('p', theirs.p_value)):
    assert mine[key] == pytest.approx(value, abs=1e-12), key
  assert mine['low'] < mine['high']  # never zero width


def test_a_server_failure_is_a_halving_between_consecutive_rounds():
  metrics = check_verdict.pd.DataFrame({
      'round': [1, 2, 3, 5, 6], 'cohort/accuracy': [0.6, 0.5, 0.3, 0.1, 0.08],
      'validation/accuracy': [0.6, 0.0, 0.0, 0.5, 0.26]})
  # 0.3 -> 0.1 skips round 4: not one round's fall.
  assert check_verdict.quantity('the server model failed (0/1)', {},
                                metrics) == 0.0
  assert check_verdict.quantity(
      'the server model failed on the validation clients (0/1)', {},
      metrics) == 1.0
