"""Tests of `reproduce.protocol`: protocols frozen before confirmatory runs.

Every experiment's protocol loads and matches its code; a protocol is
frozen with its hash, commit and seed block; a changed frozen protocol and
an exploratory run on a confirmatory seed (and the reverse) are refused in
one line before anything runs; a confirmatory report states its protocol
and reads the exploratory runs apart.
"""

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess

import pandas as pd
import pytest

import reproduce
from reproduce import __main__ as cli
from reproduce import core
from reproduce import protocol as protocols
from reproduce import sweep
from reproduce import verdicts

FIG2 = ('gel', 'fig2')

# The git work tree the tests come from. Under `bazel test` the runfiles are
# links into it and the sandbox's copy has no history: the links lead to the
# history a reviewer reads, so the checks of git run there as well.
_SOURCE_REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.realpath(__file__))))


def _copy(tmp_path, paper='gel', name='fig2') -> str:
  """A protocols directory holding a copy of one protocol."""
  base = tmp_path / 'protocols'
  (base / paper).mkdir(parents=True, exist_ok=True)
  shutil.copy(protocols.path_of(paper, name), base / paper / f'{name}.toml')
  return str(base)


@pytest.mark.parametrize('key', list(reproduce.EXPERIMENTS),
                         ids=lambda k: f'{k[0]}-{k[1]}')
def test_every_experiment_has_a_protocol_the_code_carries_out(key):
  experiment = reproduce.EXPERIMENTS[key]
  protocol = protocols.load(*key)
  assert protocol.data['claim'] and protocol.data['setup']['why']
  assert protocols.differences(protocol, experiment, 'local') == []
  # Every primary effect the protocol declares is one the code tests.
  claims = {e.claim for e in experiment.effects('local')}
  for effect in protocol.effects():
    assert effect['claim'] in claims


def test_a_frozen_protocol_is_unchanged_since_its_freeze():
  for key in reproduce.EXPERIMENTS:
    if protocols.is_frozen(*key):
      protocol = protocols.load(*key)
      record = protocols.frozen(protocol)  # raises if changed
      assert record['first_seed'] in protocols.CONFIRMATORY_SEEDS
      assert record['commit'], 'frozen from a commit that holds the file'


def test_each_frozen_version_names_a_commit_of_this_history_holding_its_text():
  """A reviewer checks a freeze against git: the commit a version names
  holds the protocol with the version's hash (so it existed then)."""
  repo = _SOURCE_REPO
  inside = subprocess.run(['git', '-C', repo, 'rev-parse', '--git-dir'],
                          capture_output=True)
  if inside.returncode:
    pytest.skip('not a git work tree (an installed copy)')
  top = subprocess.run(['git', '-C', repo, 'rev-parse', '--show-toplevel'],
                       capture_output=True, text=True, check=True)
  checked = 0
  for key in reproduce.EXPERIMENTS:
    if not protocols.is_frozen(*key):
      continue
    protocol = protocols.load(*key)
    path = os.path.relpath(os.path.realpath(protocol.path),
                           top.stdout.strip())
    for record in protocols.versions(protocol):
      shown = subprocess.run(
          ['git', '-C', repo, 'show', f'{record["commit"]}:{path}'],
          capture_output=True)
      assert shown.returncode == 0, (path, record['version'],
                                     record['commit'])
      assert hashlib.sha256(shown.stdout).hexdigest() == record['sha256']
      checked += 1
  assert checked >= len(reproduce.EXPERIMENTS) - 2


def test_freeze_records_hash_and_seeds_and_refuses_a_changed_protocol(
    tmp_path):
  base = _copy(tmp_path)
  experiment = reproduce.EXPERIMENTS[FIG2]
  protocol = protocols.load(*FIG2, base)
  with pytest.raises(ValueError, match='is not frozen'):
    protocols.frozen(protocol)
  record = protocols.freeze(protocol, experiment)
  assert record['version'] == 1 and record['sha256'] == protocol.sha256
  assert record['commit'] is None  # not in a git work tree
  assert record['first_seed'] == protocols.first_confirmatory_seed(
      protocol.sha256, [])
  assert protocols.frozen(protocol) == record
  with pytest.raises(ValueError, match='frozen already as version 1'):
    protocols.freeze(protocol, experiment)
  # One changed character: refused until frozen again, on other seeds.
  path = protocols.path_of(*FIG2, base)
  with open(path, 'a') as f:
    f.write('\n')
  changed = protocols.load(*FIG2, base)
  with pytest.raises(ValueError, match='changed since it was frozen as'
                     ' version 1'):
    protocols.frozen(changed)
  second = protocols.freeze(changed, experiment)
  assert second['version'] == 2
  assert second['first_seed'] != record['first_seed']
  assert [v['version'] for v in protocols.versions(changed)] == [1, 2]


def test_freeze_refuses_a_protocol_the_code_does_not_carry_out(tmp_path):
  base = _copy(tmp_path)
  path = protocols.path_of(*FIG2, base)
  text = open(path).read()
  with open(path, 'w') as f:
    f.write(text.replace('rounds = 400', 'rounds = 300', 1))
  with pytest.raises(ValueError, match='does not match the code: grid'
                     ' .* differs in rounds'):
    protocols.freeze(protocols.load(*FIG2, base),
                     reproduce.EXPERIMENTS[FIG2])
  assert not os.path.exists(path[:-5] + '.frozen.json')


def test_freeze_refuses_an_uncommitted_protocol_in_a_work_tree(tmp_path):
  base = _copy(tmp_path)
  subprocess.run(['git', 'init', '-q', str(tmp_path)], check=True)
  protocol = protocols.load(*FIG2, base)
  with pytest.raises(ValueError, match='not committed as it is'):
    protocols.freeze(protocol, reproduce.EXPERIMENTS[FIG2])
  git = ['git', '-C', str(tmp_path), '-c', 'user.name=t', '-c',
         'user.email=t@t']
  subprocess.run([*git, 'add', '.'], check=True)
  subprocess.run([*git, 'commit', '-qm', 'protocol'], check=True)
  record = protocols.freeze(protocol, reproduce.EXPERIMENTS[FIG2])
  head = subprocess.run([*git, 'rev-parse', 'HEAD'], capture_output=True,
                        text=True, check=True).stdout.strip()
  assert record['commit'] == head


@pytest.mark.parametrize('field, value, message', [
    ('direction = "below"', 'direction = "sideways"', 'above or below'),
    ('primary = true', 'primary_ = true', 'unknown key'),
    ('test = "difference"', 'test = "equivalence"', 'has a margin'),
    ('schema = 1', 'schema = 2', 'schema must be 1'),
])
def test_a_malformed_protocol_is_refused_naming_the_field(tmp_path, field,
                                                          value, message):
  base = _copy(tmp_path)
  path = protocols.path_of(*FIG2, base)
  text = open(path).read()
  assert field in text
  with open(path, 'w') as f:
    f.write(text.replace(field, value, 1))
  with pytest.raises(ValueError, match=message):
    protocols.load(*FIG2, base)


def test_a_size_against_its_direction_or_without_source_is_refused(tmp_path):
  base = _copy(tmp_path, 'gel', 'table2')
  path = protocols.path_of('gel', 'table2', base)
  text = open(path).read()
  with open(path, 'w') as f:
    f.write(text.replace('paper_size = -0.287', 'paper_size = 0.287', 1))
  with pytest.raises(ValueError, match='against its direction'):
    protocols.load('gel', 'table2', base)
  with open(path, 'w') as f:
    f.write(text.replace('size_source = "Table 2, Synthetic FedProx: 157 ->'
                         ' 112 rounds"\n', '', 1))
  with pytest.raises(ValueError, match='needs its size_source'):
    protocols.load('gel', 'table2', base)


def test_the_phases_seeds_cannot_mix():
  protocols.check_seeds(protocols.EXPLORATORY, [0, 99_999])
  with pytest.raises(ValueError, match='seed 100000 is a confirmatory seed'):
    protocols.check_seeds(protocols.EXPLORATORY, [3, 100_000])
  protocols.check_seeds(protocols.CONFIRMATORY, [345_000, 345_999], 345_000)
  with pytest.raises(ValueError, match='seed 3 is not one of this'
                     ' version\'s confirmatory seeds'):
    protocols.check_seeds(protocols.CONFIRMATORY, [3], 345_000)
  # Another version's block is not this one's.
  with pytest.raises(ValueError, match='346000 is not one'):
    protocols.check_seeds(protocols.CONFIRMATORY, [346_000], 345_000)


def test_seed_blocks_are_drawn_from_the_hash_and_never_reused():
  first = protocols.first_confirmatory_seed('ab' * 32, [])
  assert first in protocols.CONFIRMATORY_SEEDS
  assert (first - protocols.CONFIRMATORY_SEEDS.start) % (
      protocols.SEED_BLOCK) == 0
  assert protocols.first_confirmatory_seed('ab' * 32, [first]) != first
  assert protocols.first_confirmatory_seed('cd' * 32, []) != first


def test_confirmatory_points_take_the_frozen_block_only(tmp_path,
                                                        monkeypatch):
  experiment, phase = _frozen_fig2(tmp_path, monkeypatch)
  points = core.build_points(experiment, 'local', '/r', phase=phase)
  seeds = {int(p.values['seed']) for p in points}
  count = phase.protocol.seeds('local')
  assert seeds == set(range(phase.first_seed, phase.first_seed + count))
  exploratory = core.build_points(experiment, 'local', '/r')
  assert {int(p.values['seed']) for p in exploratory} == set(range(count))
  # An exploratory grid whose seeds reach the confirmatory range is refused.
  with pytest.raises(ValueError, match='is a confirmatory seed'):
    core.build_points(experiment, 'local', '/r', seeds=100_001)


def test_the_command_refuses_before_any_run(tmp_path, capsys):
  base = _copy(tmp_path)
  root = tmp_path / 'runs'
  argv = ['gel', 'fig2', '--scale=smoke', '--phase=confirmatory',
          f'--protocols_dir={base}', f'--root_output_dir={root}']
  assert cli.main(argv) == 2
  err = capsys.readouterr().err
  assert err.startswith('error: ') and err.count('\n') == 1
  assert 'is not frozen' in err
  assert cli.main(['freeze', 'gel', 'fig2', f'--protocols_dir={base}']) == 0
  assert 'frozen: ' in capsys.readouterr().out
  with open(protocols.path_of(*FIG2, base), 'a') as f:
    f.write('# an edit after the freeze\n')
  assert cli.main(argv) == 2
  err = capsys.readouterr().err
  assert err.count('\n') == 1 and 'changed since it was frozen' in err
  # --seeds would change the protocol's seed count: refused.
  assert cli.main([*argv, '--seeds=3']) == 2
  assert 'confirmatory run takes its protocol' in capsys.readouterr().err
  assert not root.exists()


def _fake_run(point: sweep.SweepPoint, accuracy: float) -> None:
  """A finished run directory for `point` (its metrics reach the target)."""
  os.makedirs(point.run_dir, exist_ok=True)
  flags = {a[2:].split('=', 1)[0]: a.split('=', 1)[1]
           for a in point.command if a.startswith('--') and '=' in a}
  with open(os.path.join(point.run_dir, 'hparams.json'), 'w') as f:
    json.dump(flags, f)
  rows = [{'round': r, 'test/accuracy': accuracy * r / point.total_rounds,
           'target_accuracy': 0.5}
          for r in range(1, point.total_rounds + 1)]
  pd.DataFrame(rows).to_csv(os.path.join(point.run_dir, 'metrics.csv'),
                            index=False)


def _frozen_fig2(tmp_path, monkeypatch):
  """GeL's Figure 2 frozen in a copy, its confirmatory phase, and fake runs
  read as finished where their metrics.csv is."""
  base = _copy(tmp_path)
  experiment = reproduce.EXPERIMENTS[FIG2]
  protocols.freeze(protocols.load(*FIG2, base), experiment)
  phase = core.phase_for(experiment, protocols.CONFIRMATORY, 'local', base)
  monkeypatch.setattr(sweep, 'is_finished', lambda p: os.path.isfile(
      os.path.join(p.run_dir, 'metrics.csv')))
  monkeypatch.setattr(core.analysis, 'load_run', lambda d: _load(d))
  return experiment, phase


def test_a_confirmatory_report_states_its_protocol_and_both_phases(
    tmp_path, monkeypatch):
  experiment, phase = _frozen_fig2(tmp_path, monkeypatch)
  root = str(tmp_path / 'runs')
  for exploratory in (False, True):
    for point in core.build_points(
        experiment, 'local', root,
        phase=core.Phase() if exploratory else phase):
      seed = int(point.values['seed'])
      # FedAvgCM above FedAvg on confirmatory seeds; apart on development.
      up = 'fedavgcm' in point.experiment_name
      _fake_run(point, 0.8 + (0.05 if up and not exploratory else 0)
                + 0.001 * (seed % 7))
  judged = core._judged_phase(experiment, 'local', root, None, phase, None)
  assert judged[0].verdict == verdicts.REPRODUCED
  explored = core._judged_phase(experiment, 'local', root, None,
                                core.Phase(protocols.EXPLORATORY,
                                           phase.protocol), None)
  assert explored[0].verdict == verdicts.NOT_REPRODUCED
  line = core._protocol_line(experiment, 'local', phase, None)
  assert phase.protocol.sha256[:16] in line and 'version 1' in line


def test_a_confirmatory_report_before_its_last_run_has_no_verdict(
    tmp_path, monkeypatch):
  # FedAvgCM clearly above FedAvg on every confirmatory seed: REPRODUCED
  # once every run has finished; one run short, INCOMPLETE, counted nowhere.
  experiment, phase = _frozen_fig2(tmp_path, monkeypatch)
  # Its figures and tables read columns these runs lack: not this test's.
  experiment = dataclasses.replace(
      experiment, analyze=lambda frame, out: core.Analysis(pd.DataFrame(
          columns=[core.ROW, core.QUANTITY, core.VALUE, core.STD,
                   core.NUM_RUNS]), [], []))
  root, out = str(tmp_path / 'runs'), str(tmp_path / 'report')
  points = core.build_points(experiment, 'local', root, phase=phase)
  for point in points:
    up = 'fedavgcm' in point.experiment_name
    _fake_run(point, 0.8 + (0.05 if up else 0)
              + 0.001 * (int(point.values['seed']) % 7))
  last = points[-1]
  os.rename(last.run_dir, last.run_dir + '.away')

  def written():
    path = core.write_report(experiment, 'local', root, out, phase=phase)
    with open(os.path.join(out, core.VERDICT_FILE)) as f:
      return open(path).read(), json.load(f)[protocols.CONFIRMATORY]

  text, record = written()
  assert record == {'verdict': verdicts.INCOMPLETE,
                    'finished': len(points) - 1, 'runs': len(points)}
  assert (f'{core.VERDICT_PREFIX}{verdicts.INCOMPLETE} (confirmatory).'
          f' {len(points) - 1} of the design\'s {len(points)} runs'
          ' have finished') in text
  assert core.read_verdict(os.path.join(out, 'README.md')) == (
      verdicts.INCOMPLETE)
  assert 'not a verdict)' in text
  os.rename(last.run_dir + '.away', last.run_dir)
  text, record = written()
  assert record['verdict'] == verdicts.REPRODUCED
  assert 'INCOMPLETE' not in text


def _load(run_dir: str) -> pd.DataFrame:
  frame = pd.read_csv(os.path.join(run_dir, 'metrics.csv'))
  with open(os.path.join(run_dir, 'hparams.json')) as f:
    flags = json.load(f)
  for flag, value in flags.items():
    frame[flag] = value
  frame['run'] = run_dir
  return frame


def test_history_is_refreshed_once_and_says_a_legacy_report_is_exploratory(
    tmp_path):
  experiment = reproduce.EXPERIMENTS[FIG2]
  report = tmp_path / 'gel' / 'fig2' / 'README.md'
  report.parent.mkdir(parents=True)
  report.write_text('# t\n\n**Paper:** p\n\n**Package:** x\n\n'
                    f'{core.VERDICT_PREFIX}REPRODUCED. r\n')
  core.refresh_history(experiment, str(tmp_path))
  once = report.read_text()
  assert once.count('**Protocol:**') == 1 and 'exploratory' in once
  assert once.index('**Paper:**') < once.index('**Protocol:**') < (
      once.index('**Package:**'))
  assert once.endswith('## History\n\nNo earlier version of this report is'
                       ' committed.\n')
  core.refresh_history(experiment, str(tmp_path))
  assert report.read_text() == once
  with pytest.raises(ValueError, match='does not exist'):
    core.refresh_history(reproduce.EXPERIMENTS['gel', 'fig8'], str(tmp_path))


def test_history_reads_each_committed_version_of_a_report():
  # fig_catastrophic's report at c482db1 said REVERSED for its first effect
  # (-0.8 [-1.36, -0.245]); the history shows that version and its numbers.
  if not os.path.exists(os.path.join(_SOURCE_REPO, '.git')):
    pytest.skip('no git history here (an installed copy)')
  from reproduce import history  # pylint: disable=import-outside-toplevel
  entries = history.entries(
      _SOURCE_REPO, 'results/large_cohort/fig_catastrophic/README.md',
      ['reproduce/protocols/large_cohort/fig_catastrophic.toml',
       'reproduce/large_cohort_experiments.py'], 'fig_catastrophic')
  if not any(e.commit == 'c482db1' for e in entries):
    pytest.skip('a shallow clone: c482db1 is not here')
  [entry] = [e for e in entries if e.commit == 'c482db1']
  assert entry.effects[0][1:] == ('-0.8 [-1.36, -0.245]', 'REVERSED')
  assert '- **2026-11-30 `c482db1`: PARTLY.**' in '\n'.join(
      history.markdown(entries))


@pytest.mark.parametrize('key', list(reproduce.EXPERIMENTS),
                         ids=lambda k: f'{k[0]}-{k[1]}')
def test_the_runs_are_the_protocols_grids(key):
  # The grids a command runs are built from the protocol; they are the
  # code's own, field for field, at both scales.
  experiment = reproduce.EXPERIMENTS[key]
  phase = core.Phase(protocols.EXPLORATORY, protocols.load(*key))
  for scale in ('local', 'paper'):
    assert core.setting_for(experiment, scale, phase).grids == (
        experiment.setting(scale).grids)


def test_an_exploratory_run_follows_its_protocol_file(tmp_path):
  base = _copy(tmp_path)
  path = protocols.path_of(*FIG2, base)
  text = open(path).read()
  with open(path, 'w') as f:
    f.write(text.replace('rounds = 400', 'rounds = 300', 1))
  experiment = reproduce.EXPERIMENTS[FIG2]
  phase = core.phase_for(experiment, protocols.EXPLORATORY, 'local', base)
  points = core.build_points(experiment, 'local', '/r', phase=phase)
  assert {p.total_rounds for p in points} == {300}
  # The code no longer carries it out: no confirmatory run of it.
  protocols_record = tmp_path / 'protocols' / 'gel' / 'fig2.frozen.json'
  assert not protocols_record.exists()
  with pytest.raises(ValueError, match='does not match the code'):
    protocols.freeze(protocols.load(*FIG2, base), experiment)


def test_a_primary_0_1_effect_that_can_never_reproduce_is_not_frozen(
    tmp_path):
  # Alone, 5 discordant pairs give p = 0.0625: 6 are needed; under Holm
  # over two primary effects, 7 (p = 0.0156 < 0.025).
  assert protocols.min_discordant_pairs(1) == 6
  assert protocols.min_discordant_pairs(2) == 7
  base = _copy(tmp_path, 'large_cohort', 'fig_lr_scaling')
  path = protocols.path_of('large_cohort', 'fig_lr_scaling', base)
  text = open(path).read()
  assert 'local = 16' in text
  with open(path, 'w') as f:
    f.write(text.replace('local = 16', 'local = 6', 1))
  with pytest.raises(ValueError, match='can never reproduce on 6 seeds: the'
                     ' exact test needs 7 discordant pairs'):
    protocols.freeze(protocols.load('large_cohort', 'fig_lr_scaling', base),
                     reproduce.EXPERIMENTS['large_cohort', 'fig_lr_scaling'])


def test_a_rerun_s_exploratory_line_skips_the_earlier_confirmatory_version():
  # A confirmatory report rerun at another commit: its predecessor is
  # confirmatory, and the exploratory verdict stays the one made before
  # protocols.
  from reproduce import history  # pylint: disable=import-outside-toplevel
  line = f'{core.VERDICT_PREFIX}REPRODUCED'
  assert history.report_phase(f'{line} (confirmatory). x\n') == (
      protocols.CONFIRMATORY)
  assert history.report_phase(f'{line} (exploratory). x\n') == (
      protocols.EXPLORATORY)
  assert history.report_phase(f'{line}. 3 of 3 effects\n') == (
      history.BEFORE_PROTOCOLS)
  past = [history.Entry('aaaaaaa', '2026-11-30', 's', 'PARTLY', ()),
          history.Entry('bbbbbbb', '2026-12-06', 's', 'REPRODUCED', (),
                        phase=protocols.CONFIRMATORY)]
  text = core._exploratory_line(core.Phase(protocols.CONFIRMATORY, None),
                                None, past, None, 'local', None)
  assert 'said PARTLY (`aaaaaaa`, 2026-11-30' in text
  assert 'bbbbbbb' not in text
  assert core._exploratory_line(
      core.Phase(protocols.CONFIRMATORY, None), None, past[1:], None,
      'local', None) == '**Exploratory:** none recorded.'
  assert '`bbbbbbb`: REPRODUCED (confirmatory).**' in '\n'.join(
      history.markdown(past))
  assert '`aaaaaaa`: PARTLY.**' in '\n'.join(history.markdown(past))
