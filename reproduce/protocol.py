"""Protocols: each experiment's declaration as data, frozen before its
confirmatory runs.

A protocol (`reproduce/protocols/<paper>/<experiment>.toml`, the file a
reviewer reads) states the paper's claim with its table or figure and
number; each effect (quantity, treatment and baseline runs, direction, the
paper's size, 0/1 or continuous, a difference or an equivalence within a
margin, primary or secondary); the task or substitute and why it carries the
paper's mechanism; the detector, evaluation and tuning procedure; the seed
count; and the grids of runs at each scale. The experiment modules keep what
is not data (how a quantity is read off a run, the plots, the readings);
`check` refuses a protocol that the code does not carry out as written, and
`apply` gives the code's effects the protocol's declaration.

Two phases with seeds that cannot mix:

* exploratory runs (`--phase=exploratory`) use development seeds, below
  `CONFIRMATORY_SEEDS.start`;
* confirmatory runs (`--phase=confirmatory`, what `make reproduce` runs)
  need a frozen protocol whose file is unchanged since its freeze, and use
  the block of `SEED_BLOCK` seeds its freeze drew from the confirmatory
  range. Each phase refuses the other's seeds.

`python -m reproduce freeze PAPER EXPERIMENT` freezes a protocol: it checks
the protocol against the code, records its SHA-256, the commit that holds it
(the file must be committed unchanged) and the time, and draws the version's
seed block from the hash (`first_confirmatory_seed`: fixed once the protocol
is written, so nobody picks it, and disjoint from every earlier version's).
A changed protocol is a new version, frozen again on new seeds; every
version stays in `<experiment>.frozen.json` and in the report's history.

Why one module: the file format is one contract: `draft` writes what `load`
validates, `differences` compares and `freeze` hashes, and the seed ranges
are what a frozen record draws from; split, each would restate the others'
spelling of grids and effects.
"""

import dataclasses
import datetime
import hashlib
import json
import math
import os
import tomllib
from collections.abc import Mapping, Sequence
from typing import Any, Optional

from experiment_driver import release_managers
from reproduce import history

PROTOCOLS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                             'protocols')
SCHEMA = 1
EXPLORATORY = 'exploratory'
CONFIRMATORY = 'confirmatory'
PHASES = (EXPLORATORY, CONFIRMATORY)
CONFIRMATORY_SEEDS = range(100_000, 1_000_000)
SEED_BLOCK = 1_000  # seeds a frozen version owns: first .. first + 999
# A flag value the code leaves unset (`None`), as TOML (which has no null)
# spells it.
UNSET = '(unset)'
DIRECTIONS = {'above': 1, 'below': -1}
_EFFECT_KEYS = {'claim', 'quantity', 'treatment', 'baseline', 'pair_by',
                'direction', 'outcome', 'test', 'margin', 'paper_size',
                'relative', 'primary', 'size_source'}
_EXACT_KEYS = {'claim', 'expected', 'primary'}
_SETUP_KEYS = {'task', 'why', 'detector', 'rounds', 'evaluation', 'tuning'}
_TOP_KEYS = {'schema', 'paper', 'experiment', 'source', 'claim', 'setup',
             'seeds', 'effects', 'exact', 'grids', 'notes'}


@dataclasses.dataclass(frozen=True)
class Protocol:
  paper: str
  experiment: str
  path: str
  sha256: str
  data: Mapping[str, Any]

  @property
  def frozen_path(self) -> str:
    return self.path[:-len('.toml')] + '.frozen.json'

  def seeds(self, scale: str) -> Optional[int]:
    return self.data.get('seeds', {}).get(scale)

  def effects(self) -> list[Mapping[str, Any]]:
    return list(self.data.get('effects', ()))

  def exact(self) -> list[Mapping[str, Any]]:
    return list(self.data.get('exact', ()))

  def grids(self, scale: str) -> Optional[list[Mapping[str, Any]]]:
    return self.data.get('grids', {}).get(scale)


def path_of(paper: str, experiment: str, base: str = PROTOCOLS_DIR) -> str:
  return os.path.join(base, paper, f'{experiment}.toml')


def load(paper: str, experiment: str, base: str = PROTOCOLS_DIR) -> Protocol:
  """The experiment's protocol, validated.

  Raises:
    ValueError: If it is missing or malformed (naming the file and field).
  """
  path = path_of(paper, experiment, base)
  try:
    with open(path, 'rb') as f:
      raw = f.read()
  except FileNotFoundError:
    raise ValueError(f'{path} is missing: every experiment has a protocol'
                     ' (docs/verdicts.md)') from None
  try:
    data = tomllib.loads(raw.decode('utf-8'))
  except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
    raise ValueError(f'{path}: not TOML: {e}') from None
  validate(data, path, paper, experiment)
  return Protocol(paper, experiment, path, hashlib.sha256(raw).hexdigest(),
                  data)


def validate(data: Mapping[str, Any], path: str, paper: str,
             experiment: str) -> None:
  """Raises ValueError naming the first field that is wrong."""
  def fail(what: str):
    raise ValueError(f'{path}: {what}')
  unknown = set(data) - _TOP_KEYS
  if unknown:
    fail(f'unknown key(s) {", ".join(sorted(unknown))}')
  if data.get('schema') != SCHEMA:
    fail(f'schema must be {SCHEMA}')
  if (data.get('paper'), data.get('experiment')) != (paper, experiment):
    fail(f'names {data.get("paper")}/{data.get("experiment")}, not'
         f' {paper}/{experiment}')
  for key in ('source', 'claim'):
    if not str(data.get(key, '')).strip():
      fail(f'{key} is empty')
  setup = data.get('setup', {})
  if set(setup) - _SETUP_KEYS:
    fail(f'setup: unknown key(s) {", ".join(sorted(set(setup) - _SETUP_KEYS))}')
  for key in ('task', 'why', 'tuning'):
    if not str(setup.get(key, '')).strip():
      fail(f'setup.{key} is empty')
  seeds = data.get('seeds', {})
  for scale, count in seeds.items():
    if not isinstance(count, int) or count < 1 or count > SEED_BLOCK // 10:
      fail(f'seeds.{scale} must be an integer in 1..{SEED_BLOCK // 10}')
  effects = data.get('effects', [])
  claims = [e.get('claim') for e in (*effects, *data.get('exact', []))]
  if len(set(claims)) != len(claims):
    fail('two effects have one claim')
  for i, effect in enumerate(effects):
    where = f'effects[{i}] ({effect.get("claim", "")[:40]!r})'
    if set(effect) - _EFFECT_KEYS:
      fail(f'{where}: unknown key(s)'
           f' {", ".join(sorted(set(effect) - _EFFECT_KEYS))}')
    for key in ('claim', 'quantity', 'treatment', 'baseline', 'direction',
                'primary'):
      if key not in effect:
        fail(f'{where}: {key} is missing')
    if effect['direction'] not in DIRECTIONS:
      fail(f'{where}: direction must be above or below')
    if effect.get('outcome', 'continuous') not in ('continuous', 'binary'):
      fail(f'{where}: outcome must be continuous or binary')
    test = effect.get('test', 'difference')
    if test not in ('difference', 'equivalence'):
      fail(f'{where}: test must be difference or equivalence')
    if (test == 'equivalence') != ('margin' in effect):
      fail(f'{where}: an equivalence test, and only one, has a margin')
    size = effect.get('paper_size')
    if size is not None:
      if not isinstance(size, (int, float)) or math.isnan(size):
        fail(f'{where}: paper_size must be a number')
      if size * DIRECTIONS[effect['direction']] < 0:
        fail(f'{where}: paper_size {size:+g} is against its direction'
             f' {effect["direction"]}')
      if not str(effect.get('size_source', '')).strip():
        fail(f'{where}: a paper_size needs its size_source (table, figure)')
  for i, exact in enumerate(data.get('exact', [])):
    if set(exact) - _EXACT_KEYS or {'claim', 'expected'} - set(exact):
      fail(f'exact[{i}]: needs claim and expected (and primary)')


# The code's side, as the protocol spells it.


def _value(value: Any) -> Any:
  if value is None:
    return UNSET
  if isinstance(value, tuple):
    return [_value(v) for v in value]
  return value


def _flags(flags: Mapping[str, Any]) -> dict[str, Any]:
  return {str(k): _value(v) for k, v in sorted(flags.items())}


def describe_grid(grid) -> dict[str, Any]:
  """A `core.Grid` as the protocol's `grids` list spells it."""
  described = {'name': grid.name, 'rounds': grid.total_rounds,
               'flags': _flags(grid.flags),
               'axes': {a.flag: list(a.values) for a in grid.axes}}
  if grid.seed_flag != 'seed':
    described['seed_flag'] = _value(grid.seed_flag)
  if grid.tied_seed_flags:
    described['tied_seed_flags'] = list(grid.tied_seed_flags)
  if grid.max_seeds is not None:
    described['max_seeds'] = grid.max_seeds
  if grid.first_seed:
    described['first_seed'] = grid.first_seed
  if grid.smoke_flags:
    described['smoke_flags'] = _flags(grid.smoke_flags)
  return described


def describe_effect(effect) -> dict[str, Any]:
  """A `verdicts.Effect` as the protocol's `effects` list spells it (its
  declared part as the code gives it)."""
  described = {'claim': effect.claim, 'quantity': effect.quantity.name,
               'treatment': _flags(effect.treatment),
               'baseline': _flags(effect.baseline),
               'pair_by': list(effect.pair_flags),
               'direction': 'above' if effect.direction > 0 else 'below',
               'outcome': effect.outcome, 'test': effect.test,
               'primary': effect.primary}
  if effect.margin is not None:
    described['margin'] = effect.margin
  if effect.paper_size is not None:
    described['paper_size'] = effect.paper_size
  if effect.relative:
    described['relative'] = True
  return described


_SELECTION = ('quantity', 'treatment', 'baseline', 'pair_by', 'direction')


def _normal(value: Any) -> Any:
  """Values compared as the runs compare them (800, 800.0, '800' alike)."""
  if isinstance(value, bool):
    return value
  if isinstance(value, (int, float)):
    return float(value)
  if isinstance(value, str):
    try:
      return float(value)
    except ValueError:
      return value
  if isinstance(value, Mapping):
    return {k: _normal(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_normal(v) for v in value]
  return value


def differences(protocol: Protocol, experiment, scale: str) -> list[str]:
  """How the code's grids and effects at `scale` differ from the
  protocol's (empty: the code carries the protocol out as written)."""
  from reproduce import verdicts  # pylint: disable=import-outside-toplevel
  found = []
  if scale in ('local', 'paper'):
    declared = protocol.grids(scale)
    if declared is not None:
      # Grids in order (two may share a name: one grid's cells at other
      # rounds), compared one by one.
      code = [describe_grid(g) for g in experiment.setting(scale).grids]
      for i in range(max(len(code), len(declared))):
        if i >= len(code):
          found.append(f'grid {declared[i]["name"]} ({scale}, #{i + 1}) is in'
                       ' the protocol, not the code')
        elif i >= len(declared):
          found.append(f'grid {code[i]["name"]} ({scale}, #{i + 1}) is not in'
                       ' the protocol')
        elif _normal(declared[i]) != _normal(code[i]):
          mine, grid = declared[i], code[i]
          keys = sorted(k for k in set(mine) | set(grid)
                        if _normal(mine.get(k)) != _normal(grid.get(k)))
          found.append(f'grid {grid["name"]} ({scale}, #{i + 1}) differs in'
                       f' {", ".join(keys)}')
  code_effects = list(experiment.effects('local' if scale == 'smoke'
                                         else scale))
  declared = {e['claim']: e for e in protocol.effects()}
  exact = {e['claim']: e for e in protocol.exact()}
  seen = set()
  for effect in code_effects:
    seen.add(effect.claim)
    if isinstance(effect, verdicts.Exact):
      if effect.claim not in exact:
        found.append(f'exact claim {effect.claim[:60]!r} is not in the'
                     ' protocol')
      elif exact[effect.claim]['expected'] != effect.expected:
        found.append(f'exact claim {effect.claim[:60]!r}: expected differs')
      continue
    if effect.claim not in declared:
      found.append(f'effect {effect.claim[:60]!r} is not in the protocol')
      continue
    mine, code = declared[effect.claim], describe_effect(effect)
    for key in _SELECTION:
      if _normal(mine.get(key, ['seed'] if key == 'pair_by' else None)) != (
          _normal(code[key])):
        found.append(f'effect {effect.claim[:60]!r}: {key} differs')
    if effect.paper_size is not None and mine.get('paper_size') is not None \
        and not math.isclose(effect.paper_size, mine['paper_size']):
      found.append(f'effect {effect.claim[:60]!r}: the code\'s paper size'
                   f' {effect.paper_size:g} is not the protocol\'s'
                   f' {mine["paper_size"]:g}')
  if scale != 'paper':
    for claim in (set(declared) | set(exact)) - seen:
      found.append(f'effect {claim[:60]!r} is in the protocol, not the code')
  return found


def apply(protocol: Optional[Protocol], effects: Sequence[Any]) -> list[Any]:
  """The code's effects with the protocol's declaration (direction, size,
  outcome, test, margin, relative, primary) where it declares them."""
  from reproduce import verdicts  # pylint: disable=import-outside-toplevel
  if protocol is None:
    return list(effects)
  declared = {e['claim']: e for e in protocol.effects()}
  exact = {e['claim']: e for e in protocol.exact()}
  out = []
  for effect in effects:
    if isinstance(effect, verdicts.Exact):
      mine = exact.get(effect.claim)
      out.append(effect if mine is None else dataclasses.replace(
          effect, primary=mine.get('primary', True)))
      continue
    mine = declared.get(effect.claim)
    if mine is None:
      out.append(effect)
      continue
    out.append(dataclasses.replace(
        effect, direction=DIRECTIONS[mine['direction']],
        paper_size=mine.get('paper_size'),
        outcome=mine.get('outcome', verdicts.CONTINUOUS),
        test=mine.get('test', verdicts.DIFFERENCE),
        margin=mine.get('margin'), relative=mine.get('relative', False),
        primary=mine['primary']))
  return out


# Freezing.


def versions(protocol: Protocol) -> list[dict[str, Any]]:
  """Every frozen version of the protocol, oldest first."""
  try:
    with open(protocol.frozen_path) as f:
      return list(json.load(f)['versions'])
  except FileNotFoundError:
    return []
  except (json.JSONDecodeError, KeyError, TypeError) as e:
    raise ValueError(f'{protocol.frozen_path} is damaged ({e}); restore it'
                     ' from git') from None


def first_confirmatory_seed(sha256: str, taken: Sequence[int]) -> int:
  """The version's seed block, drawn from its hash: one of the blocks of
  `SEED_BLOCK` seeds in `CONFIRMATORY_SEEDS`, the next free one if an
  earlier version holds it."""
  blocks = len(CONFIRMATORY_SEEDS) // SEED_BLOCK
  start = int(sha256[:16], 16) % blocks
  for step in range(blocks):
    first = CONFIRMATORY_SEEDS.start + ((start + step) % blocks) * SEED_BLOCK
    if first not in taken:
      return first
  raise ValueError('every confirmatory seed block is taken')


def committed_at(path: str) -> Optional[str]:
  """The commit (HEAD) that holds `path` as it is on disk, or None when it
  is not in a git work tree.

  Raises:
    ValueError: In a work tree where the file is untracked or modified.
  """
  directory = os.path.dirname(path)
  inside = history.git(directory, 'rev-parse', '--is-inside-work-tree')
  if (inside or '').strip() != 'true':
    return None
  status = history.git(directory, 'status', '--porcelain', '--', path)
  if status is None or status.strip():
    raise ValueError(f'{path} is not committed as it is: commit it, then'
                     ' freeze (the freeze records the commit that holds it)')
  return (history.git(directory, 'rev-parse', 'HEAD') or '').strip() or None


def min_discordant_pairs(primary: int, alpha: float = 0.05) -> int:
  """The fewest discordant pairs, all one way, whose exact two-sided
  McNemar p-value (2 / 2^b) passes `alpha` after Holm over `primary`
  effects (its strictest step, alpha / primary)."""
  pairs = 1
  while 2 * 0.5 ** pairs >= alpha / max(primary, 1):
    pairs += 1
  return pairs


def _undecidable(protocol: Protocol) -> str:
  """Why a primary 0/1 effect could never reproduce at the protocol's
  local seed count, or ''."""
  effects = protocol.effects()
  primary = sum(bool(e['primary']) for e in effects) + sum(
      bool(e.get('primary', True)) for e in protocol.exact())
  seeds = protocol.seeds('local')
  needed = min_discordant_pairs(primary)
  for effect in effects:
    if effect['primary'] and effect.get('outcome') == 'binary' and (
        seeds is not None and seeds < needed):
      return (f'the primary 0/1 effect {effect["claim"][:60]!r} can never'
              f' reproduce on {seeds} seeds: the exact test needs {needed}'
              f' discordant pairs under Holm over {primary} primary effects')
  return ''


def freeze(protocol: Protocol, experiment,
           dry_run: bool = False) -> dict[str, Any]:
  """Freezes the protocol as a new version (module docstring); `dry_run`:
  checks it and returns the record, writing nothing.

  Raises:
    ValueError: If the code does not carry the protocol out, the file is
      not committed as it is, or this text is frozen already.
  """
  found = differences(protocol, experiment, 'local')
  if found:
    raise ValueError(f'{protocol.path} does not match the code: '
                     + '; '.join(found[:5])
                     + (f' (and {len(found) - 5} more)' if len(found) > 5
                        else ''))
  if not protocol.effects() and not protocol.exact():
    raise ValueError(f'{protocol.path} declares no effect: nothing to'
                     ' confirm')
  undecidable = _undecidable(protocol)
  if undecidable:
    raise ValueError(f'{protocol.path}: {undecidable}')
  earlier = versions(protocol)
  for record in earlier:
    if record['sha256'] == protocol.sha256:
      if dry_run:  # nothing to do: the record as it stands
        return {**record, 'already': True}
      raise ValueError(f'{protocol.path} is frozen already as version'
                       f' {record["version"]} (sha256'
                       f' {protocol.sha256[:12]})')
  record = {
      'version': len(earlier) + 1,
      'sha256': protocol.sha256,
      'commit': committed_at(protocol.path),
      'frozen_at': datetime.datetime.now(datetime.timezone.utc).strftime(
          '%Y-%m-%dT%H:%M:%SZ'),
      'first_seed': first_confirmatory_seed(
          protocol.sha256, [r['first_seed'] for r in earlier]),
  }
  if dry_run:
    return record
  release_managers.write_atomically(
      protocol.frozen_path,
      json.dumps({'versions': [*earlier, record]}, indent=1) + '\n')
  return record


def frozen(protocol: Protocol) -> dict[str, Any]:
  """The frozen version a confirmatory run of this protocol uses.

  Raises:
    ValueError: If it was never frozen, or its file changed since.
  """
  records = versions(protocol)
  if not records:
    raise ValueError(
        f'{protocol.path} is not frozen: a confirmatory run needs a frozen'
        f' protocol (python -m reproduce freeze {protocol.paper}'
        f' {protocol.experiment})')
  latest = records[-1]
  if latest['sha256'] != protocol.sha256:
    raise ValueError(
        f'{protocol.path} changed since it was frozen as version'
        f' {latest["version"]} (sha256 {latest["sha256"][:12]}, now'
        f' {protocol.sha256[:12]}): a changed protocol is a new version;'
        f' freeze it again (python -m reproduce freeze {protocol.paper}'
        f' {protocol.experiment}), on new confirmatory seeds')
  return latest


def is_frozen(paper: str, experiment: str,
              base: str = PROTOCOLS_DIR) -> bool:
  """Whether the protocol has a frozen version (changed or not)."""
  return os.path.isfile(path_of(paper, experiment, base)[:-len('.toml')]
                        + '.frozen.json')


def check_seeds(phase: str, seeds: Sequence[int],
                first_seed: Optional[int] = None) -> None:
  """Refuses a seed of the other phase's range (and a confirmatory seed
  outside its version's block).

  Raises:
    ValueError: Naming the seed.
  """
  for seed in seeds:
    confirmatory = seed in CONFIRMATORY_SEEDS
    if phase == EXPLORATORY and (confirmatory or seed < 0):
      raise ValueError(
          f'seed {seed} is a confirmatory seed: an exploratory run takes'
          f' development seeds (0-{CONFIRMATORY_SEEDS.start - 1})')
    if phase == CONFIRMATORY and not (
        confirmatory and first_seed is not None
        and first_seed <= seed < first_seed + SEED_BLOCK):
      raise ValueError(
          f'seed {seed} is not one of this version\'s confirmatory seeds'
          + (f' ({first_seed}-{first_seed + SEED_BLOCK - 1})'
             if first_seed is not None else ''))


# Drafting a protocol from the code (a new experiment's first version).


def _toml_key(key: str) -> str:
  return key if key.replace('_', '').replace('-', '').isalnum() and \
      key.isascii() else json.dumps(key, ensure_ascii=False)


def toml_value(value: Any) -> str:
  """A value as TOML (strings, numbers, booleans, lists, inline tables)."""
  if isinstance(value, bool):
    return 'true' if value else 'false'
  if isinstance(value, int):
    return str(value)
  if isinstance(value, float):
    if math.isnan(value):
      return 'nan'
    if math.isinf(value):
      return 'inf' if value > 0 else '-inf'
    return repr(value)
  if isinstance(value, str):
    return json.dumps(value, ensure_ascii=False)
  if isinstance(value, Mapping):
    return ('{' + ', '.join(f'{_toml_key(str(k))} = {toml_value(v)}'
                            for k, v in value.items()) + '}')
  if isinstance(value, (list, tuple)):
    return '[' + ', '.join(toml_value(v) for v in value) + ']'
  if value is None:
    return json.dumps(UNSET)
  raise TypeError(f'no TOML for {value!r}')


def _table(name: str, values: Mapping[str, Any], array: bool = False
           ) -> list[str]:
  lines = [f'[[{name}]]' if array else f'[{name}]']
  lines += [f'{_toml_key(k)} = {toml_value(v)}' for k, v in values.items()]
  return lines + ['']


def draft(experiment, setup: Optional[Mapping[str, str]] = None,
          seeds: Optional[Mapping[str, int]] = None,
          declared: Optional[Mapping[str, Mapping[str, Any]]] = None,
          claim: Optional[str] = None, notes: str = '') -> str:
  """A protocol's text from the code's grids and effects: what `check`
  compares, and the declared parts (`setup`, `seeds`, each effect's
  `declared` fields by claim) where given. A draft with an empty
  `setup.why` or `setup.tuning` does not load: a person states them."""
  from reproduce import verdicts  # pylint: disable=import-outside-toplevel
  setup = dict(setup or {})
  for key in ('task', 'why', 'tuning'):
    setup.setdefault(key, '')
  lines = [
      '# The protocol of one experiment (reproduce/protocol.py): what it',
      '# claims, tests and runs, frozen before its confirmatory runs.',
      f'schema = {SCHEMA}',
      f'paper = {toml_value(experiment.paper)}',
      f'experiment = {toml_value(experiment.name)}',
      f'source = {toml_value(experiment.source)}',
      f'claim = {toml_value(claim or experiment.claim)}',
  ]
  if notes:
    lines.append(f'notes = {toml_value(notes)}')
  lines.append('')
  lines += _table('setup', setup)
  seed_counts = dict(seeds or {})
  for scale in ('local', 'paper'):
    seed_counts.setdefault(scale, experiment.setting(scale).seeds)
  lines += _table('seeds', seed_counts)
  for effect in experiment.effects('local'):
    mine = dict((declared or {}).get(effect.claim, {}))
    if isinstance(effect, verdicts.Exact):
      lines += _table('exact', {'claim': effect.claim,
                                'expected': effect.expected,
                                'primary': mine.get('primary', True)},
                      array=True)
      continue
    described = describe_effect(effect)
    described.update(mine)
    lines += _table('effects', described, array=True)
  for scale in ('local', 'paper'):
    for grid in experiment.setting(scale).grids:
      lines += _table(f'grids.{scale}', describe_grid(grid), array=True)
  return '\n'.join(lines).rstrip() + '\n'
