"""A report's history, read from git: every earlier committed version of
the report (commit, date, verdict, its effects' values) and what changed
in its protocol or experiment code between them.

A report is regenerated many times while its experiment is developed; a
reader who sees only the last version cannot tell a verdict that held from
the start from one reached after the setup was changed. Git already holds
every version, so the history is generated, never written by hand: `entries`
walks `git log` of the report's file, `changes_between` lists the commits
between two versions that touched the experiment's protocol, or its module
with the experiment named in the commit's subject.
"""

import dataclasses
import os
import re
import subprocess
from collections.abc import Sequence
from typing import Optional

_VERDICT = re.compile(r'^\*\*Verdict[^*]*:\*\* ([A-Z][A-Z ]+?)[.(]', re.M)
# A report of a phase says it after its verdict: `REPRODUCED (confirmatory).`
_PHASE = re.compile(r'^\*\*Verdict[^*]*:\*\* [A-Z][A-Z ]+? \((\w+)\)', re.M)
# The phase of a report made before protocols (its verdict names none).
BEFORE_PROTOCOLS = 'before protocols'
_MAX_CHANGES = 6


@dataclasses.dataclass(frozen=True)
class Entry:
  commit: str
  date: str
  subject: str
  verdict: str
  effects: tuple[tuple[str, str, str], ...]  # (claim, value [interval], verdict)
  changes: tuple[str, ...] = ()  # commits since the previous entry
  # 'confirmatory' or 'exploratory' as the version says, else
  # BEFORE_PROTOCOLS.
  phase: str = BEFORE_PROTOCOLS


def git(repo: str, *args: str) -> Optional[str]:
  """`git -C repo args`'s standard output, or None when git is missing or
  the command fails (outside a work tree, an unknown revision)."""
  try:
    done = subprocess.run(['git', '-C', repo, *args], capture_output=True,
                          text=True, check=False)
  except FileNotFoundError:
    return None
  return done.stdout if done.returncode == 0 else None


def report_phase(text: str) -> str:
  """The phase a committed report's verdict line names ('confirmatory',
  'exploratory'), or BEFORE_PROTOCOLS when it names none."""
  found = _PHASE.search(text)
  return found.group(1) if found else BEFORE_PROTOCOLS


def parse_report(text: str) -> tuple[str, tuple[tuple[str, str, str], ...]]:
  """(verdict, effects) a committed report states: its verdict line, and
  each row of its first effects table as (claim, value and interval,
  verdict); ('none stated', ()) for a report written before verdicts."""
  found = _VERDICT.search(text)
  verdict = found.group(1).strip() if found else 'none stated'
  effects = []
  lines = text.splitlines()
  for i, line in enumerate(lines):
    if line.startswith('| effect (paper)'):
      header = [c.strip() for c in line.strip('|').split('|')]
      value_col = next((j for j, c in enumerate(header)
                        if c.startswith('treatment')), None)
      for row in lines[i + 2:]:
        if not row.startswith('|'):
          break
        cells = [c.strip() for c in row.strip('|').split('|')]
        if value_col is None or len(cells) != len(header):
          continue
        effects.append((cells[0], cells[value_col], cells[-1]))
      break
  return verdict, tuple(effects)


def changes_between(repo: str, older: str, newer: str,
                    paths: Sequence[str], name: str) -> tuple[str, ...]:
  """Subjects of the commits after `older` up to `newer` that touched
  `paths[0]` (the protocol) or touched `paths[1:]` (the experiment module,
  the verdict rules) naming `name` in their subject."""
  out = git(repo, 'log', '--format=%h %s', f'{older}..{newer}', '--',
             *paths)
  if not out:
    return ()
  protocol = git(repo, 'log', '--format=%h', f'{older}..{newer}', '--',
                  paths[0]) or ''
  protocol_commits = set(protocol.split())
  picked = []
  for line in out.splitlines():
    commit, _, subject = line.partition(' ')
    if commit in protocol_commits or name in subject:
      picked.append(f'{commit} {subject}')
  return tuple(picked)


def entries(repo: str, report: str, paths: Sequence[str],
            name: str) -> list[Entry]:
  """Every committed version of `report` (a path relative to `repo`),
  oldest first, with the changes (`changes_between`) since the one
  before; [] outside a git work tree."""
  log = git(repo, 'log', '--format=%H %cs %s', '--', report)
  if not log:
    return []
  found = []
  previous = None
  for line in reversed(log.splitlines()):
    commit, date, subject = (line.split(' ', 2) + [''])[:3]
    text = git(repo, 'show', f'{commit}:{report}')
    if text is None:  # the commit deleted it
      continue
    verdict, effects = parse_report(text)
    changes = (changes_between(repo, previous, commit, paths, name)
               if previous else ())
    found.append(Entry(commit[:7], date, subject, verdict, effects, changes,
                       report_phase(text)))
    previous = commit
  return found


def _cut(text: str, width: int) -> str:
  return text if len(text) <= width else text[:width - 1] + '…'


def markdown(found: Sequence[Entry]) -> list[str]:
  """The report's History section (lines), newest first."""
  if not found:
    return ['No earlier version of this report is committed.']
  lines = [f'{len(found)} earlier committed versions of this report, newest'
           ' first (`git log` of its file; effects as each version stated'
           ' them, under the rules of its day). Versions made before the'
           ' protocol was frozen are exploratory: development seeds, setups'
           ' that changed as results came in.', '']
  for entry in reversed(found):
    phase = ('' if entry.phase == BEFORE_PROTOCOLS
             or entry.verdict == 'none stated' else f' ({entry.phase})')
    lines.append(f'- **{entry.date} `{entry.commit}`: {entry.verdict}{phase}.**'
                 f' {_cut(entry.subject, 160)}')
    for claim, value, verdict in entry.effects:
      lines.append(f'  - {_cut(claim, 90)}: {value} → {verdict}')
    if entry.changes:
      shown = entry.changes[:_MAX_CHANGES]
      lines.append('  - changed since the version before: '
                   + '; '.join(f'`{c.split(" ", 1)[0]}` '
                               + _cut(c.split(' ', 1)[1], 100)
                               for c in shown)
                   + (f' (and {len(entry.changes) - len(shown)} more)'
                      if len(entry.changes) > len(shown) else ''))
  return lines


def of_report(repo: str, report_path: str, protocol_path: str,
              module_path: str, name: str) -> list[Entry]:
  """`entries` for absolute paths under `repo`."""
  rel = lambda p: os.path.relpath(p, repo)
  return entries(repo, rel(report_path),
                 [rel(protocol_path), rel(module_path),
                  'reproduce/verdicts.py'], name)
