"""Tests of `reproduce.verdicts` and of every experiment's declared effects.

The rules (docs/verdicts.md) on made-up runs whose answer is known, and each
experiment's effects against its own grids: every treatment and baseline
names runs the experiment makes, paired by seed, so that a typo in a flag
cannot turn a verdict into NOT TESTABLE unseen.
"""

import gc
import json
import os

from absl import flags
from absl.testing import flagsaver
import numpy as np
import pandas as pd
import pytest
from scipy import stats
from statsmodels.stats import proportion
from statsmodels.stats import weightstats

from experiment_driver import build  # noqa: F401  (defines the flags)
from experiment_driver import flag_rules
import reproduce
from reproduce import core
from reproduce import verdicts

FLAGS = flags.FLAGS
_FINAL = verdicts.final('test/accuracy', 'final test accuracy')


def _runs(values: dict, rounds: int = 3) -> pd.DataFrame:
  """A tidy frame: one run per ((arm, seed) -> final accuracy)."""
  rows = []
  for (arm, seed), final in values.items():
    for r in range(1, rounds + 1):
      rows.append({'run': f'/runs/{arm}_{seed}', 'round': r, 'arm': arm,
                   'seed': seed, 'clients_per_round': 10,
                   'test/accuracy': final * r / rounds})
  return pd.DataFrame(rows)


def _effect(direction=1, paper_size=None, **kwargs):
  return verdicts.Effect('t beats b', _FINAL, {'arm': 't'}, {'arm': 'b'},
                         direction, paper_size, **kwargs)


def test_pairing_by_seed_cancels_the_seeds_noise():
  # Seeds move both arms by up to 0.3; the treatment is 0.01 above in each.
  offsets = {0: 0.0, 1: 0.3, 2: 0.1, 3: 0.2, 4: 0.25}
  frame = _runs({**{('t', s): 0.5 + o + 0.01 + 0.001 * s
                    for s, o in offsets.items()},
                 **{('b', s): 0.5 + o for s, o in offsets.items()}})
  result = verdicts.assess(frame, _effect())
  assert result.pairs == 5
  assert result.mean == pytest.approx(0.012)
  assert 0 < result.low < result.mean < result.high
  assert result.verdict == verdicts.DIRECTION_ONLY


def test_the_reports_count_a_grids_cells_not_seeds():
  # One seed, five rate cells: the pairs are cells, and the reports say so;
  # a single seed flag (AdaBest's partition_seed) still counts seeds.
  frame = _runs({('t', 0): 0.9, ('b', 0): 0.5})
  frame = pd.concat([frame.assign(rate=r, run=frame['run'] + f'_{r}',
                                  **{'test/accuracy': frame['test/accuracy']
                                     + r})
                     for r in (0.1, 0.2, 0.3, 0.4, 0.5)])
  by_cell = _effect(pair_by=('rate', 'seed'))
  result = verdicts.assess(frame, by_cell)
  assert result.pairs == 5
  assert '5 paired cells (rate x seed)) ->' in (
      verdicts.package_sentence([result]))
  assert verdicts.effects_table([result])['pairs'].tolist() == ['5 cells']
  assert not _effect(pair_by='rate').pairs_by_seed
  assert _effect(pair_by='partition_seed').pair_unit() == 'seeds'
  seeds = verdicts.assess(_runs({('t', 0): 0.9, ('t', 1): 0.8,
                                 ('b', 0): 0.5, ('b', 1): 0.5}), _effect())
  assert verdicts.package_sentence([seeds]).endswith(
      '2 paired seeds, fewer than 5.')
  assert verdicts.effects_table([seeds])['pairs'].tolist() == [2]


def test_runs_that_end_equal_read_zero_not_float_noise():
  # Float32 accuracies of runs ending on the same example count: their
  # paired differences are ~1e-8, not zero, and read as +0.
  frame = _runs({**{('t', s): np.float32(0.98055553) + 0.01 * s
                    for s in range(5)},
                 **{('b', s): 0.98055555 + 0.01 * s for s in range(5)}})
  result = verdicts.assess(frame, _effect())
  assert result.mean != 0
  assert 'differs by +0 ([' in verdicts.package_sentence([result])
  assert verdicts.effects_table([result]).iloc[0].str.startswith(
      '+0 [').any()


def test_each_verdict_of_one_effect():
  up = np.array([0.10, 0.12, 0.11, 0.13, 0.09])
  assert verdicts.verdict_of_differences(_effect(), up).verdict == (
      verdicts.DIRECTION_ONLY)
  assert verdicts.verdict_of_differences(_effect(-1), up).verdict == (
      verdicts.REVERSED)
  # In the paper's direction, but under half the paper's size.
  partly = verdicts.verdict_of_differences(_effect(paper_size=0.3), up)
  assert partly.verdict == verdicts.PARTLY
  assert 'half' in partly.reason
  # At least half: reproduced, whatever the sign convention of the size.
  assert verdicts.verdict_of_differences(
      _effect(paper_size=0.2), up).verdict == verdicts.REPRODUCED
  assert verdicts.verdict_of_differences(
      _effect(-1, paper_size=-0.2), -up).verdict == verdicts.REPRODUCED
  noisy = np.array([0.1, -0.12, 0.05, 0.02, -0.04])
  assert verdicts.verdict_of_differences(_effect(), noisy).verdict == (
      verdicts.NOT_REPRODUCED)
  # Fewer than five pairs: no verdict, however clear the pairs look.
  four = verdicts.verdict_of_differences(_effect(), up[:4])
  assert four.verdict == verdicts.NOT_TESTABLE
  assert '4 paired seeds, fewer than 5' in four.reason


def test_a_relative_size_is_judged_as_a_ratio():
  # GeL's speed-up: 100 -> 70 rounds is (t - b) / b = -0.3; the paper -0.24.
  frame = _runs({**{('t', s): 70 + s for s in range(6)},
                 **{('b', s): 100 + s for s in range(6)}})
  result = verdicts.assess(frame, _effect(-1, paper_size=-0.24,
                                          relative=True))
  assert result.mean == pytest.approx(np.mean(
      [-30 / (100 + s) for s in range(6)]))
  assert result.verdict == verdicts.REPRODUCED
  # Half the paper's relative size is -0.12: -0.05 is PARTLY.
  small = _runs({**{('t', s): 95 + s * 1.01 for s in range(6)},
                 **{('b', s): 100 + s for s in range(6)}})
  assert verdicts.assess(small, _effect(-1, paper_size=-0.24,
                                        relative=True)).verdict == (
      verdicts.PARTLY)


def test_the_t_test_is_scipys():
  diffs = np.array([1.0, 2.0, 3.0, 4.0, 6.0])
  result = verdicts.verdict_of_differences(_effect(), diffs)
  expected = stats.ttest_1samp(diffs, 0.0)
  assert result.p_value == pytest.approx(expected.pvalue)
  low, high = expected.confidence_interval(0.95)
  assert (result.low, result.high) == (pytest.approx(low),
                                       pytest.approx(high))
  # t(0.975, 4) = 2.776: the interval by hand.
  half = 2.776445 * np.std(diffs, ddof=1) / np.sqrt(5)
  assert result.low == pytest.approx(3.2 - half, rel=1e-5)


def test_five_discordant_pairs_and_five_ties_are_not_significant():
  # fig_catastrophic at c0aab98: 5 runs fail at M = 800 and not at M = 10,
  # 5 pairs tie. A t interval called it +0.5 [+0.123, +0.877]; the exact
  # McNemar (sign) test gives p = 2 / 2^5 = 0.0625.
  binary = _effect(paper_size=0.8, outcome=verdicts.BINARY)
  result = verdicts.verdict_of_differences(
      binary, np.array([1.0] * 5 + [0.0] * 5))
  assert result.p_value == pytest.approx(0.0625)
  assert result.verdict == verdicts.NOT_REPRODUCED
  assert result.low < 0 < result.high  # the exact interval agrees
  # Six of six discordant in the paper's direction: p = 0.03125.
  six = verdicts.verdict_of_differences(binary, np.array([1.0] * 6))
  assert six.p_value == pytest.approx(0.03125)
  assert six.verdict == verdicts.REPRODUCED
  assert six.low > 0


@pytest.mark.parametrize('treated, base', [
    ([1] * 10, [0] * 10),   # every pair discordant one way
    ([1] * 10, [1] * 10),   # every run fails in both arms
    ([0] * 10, [0] * 10),   # no run fails
    ([1] * 5, [0] * 5),
])
def test_a_zero_width_interval_cannot_occur_for_0_1_outcomes(treated, base):
  # The t interval of identical differences is [d, d] (fig_lr_scaling's
  # [+1, +1]); the exact and Newcombe intervals never are.
  test = verdicts.mcnemar_test(np.array(treated, float),
                               np.array(base, float))
  assert test.high - test.low > 0.1
  assert test.low <= test.mean <= test.high


def test_a_0_1_outcome_must_be_0_or_1():
  with pytest.raises(ValueError, match='0/1 outcome'):
    verdicts.mcnemar_test(np.array([0.5, 1.0]), np.array([0.0, 0.0]))


def test_newcombe_interval_is_the_hybrid_score_interval():
  # With uncorrelated pairs (a d = b c) Newcombe's paired interval is his
  # interval for independent proportions, which statsmodels computes.
  low, high = verdicts.newcombe_interval(6, 2, 3, 1)
  expected = proportion.confint_proportions_2indep(8, 12, 9, 12,
                                                   method='newcomb')
  assert (low, high) == (pytest.approx(expected[0]),
                         pytest.approx(expected[1]))
  # Positive correlation (concordant pairs) narrows it.
  narrow = verdicts.newcombe_interval(30, 2, 3, 15)
  wide = proportion.confint_proportions_2indep(32, 50, 33, 50,
                                               method='newcomb')
  assert narrow[1] - narrow[0] < wide[1] - wide[0]


def test_equivalence_is_tost_against_the_margin():
  same = np.array([0.004, -0.003, 0.001, 0.002, -0.001, 0.0])
  claim = _effect(test=verdicts.EQUIVALENCE, margin=0.01)
  result = verdicts.verdict_of_differences(claim, same)
  expected = weightstats.DescrStatsW(same).ttost_mean(-0.01, 0.01)[0]
  assert result.p_value == pytest.approx(expected)
  assert result.verdict == verdicts.REPRODUCED
  # A real difference is not equivalence, whatever its sign.
  apart = same + 0.05
  assert verdicts.verdict_of_differences(claim, apart).verdict == (
      verdicts.NOT_REPRODUCED)
  # Noise too wide for the margin is not equivalence either.
  wide = np.array([0.05, -0.04, 0.03, -0.05, 0.02])
  assert verdicts.verdict_of_differences(claim, wide).verdict == (
      verdicts.NOT_REPRODUCED)


@pytest.mark.parametrize('p_values, adjusted', [
    # Sorted, times m, m - 1, ..., 1, running maximum, capped at 1, back in
    # the order given.
    ([0.01, 0.04, 0.03, 0.2], [0.04, 0.09, 0.09, 0.2]),
    ([0.5], [0.5]),
    ([0.3, 0.02, 0.4], [0.6, 0.06, 0.6]),
    ([0.02, 0.02, 0.9, 0.001, 0.6], [0.08, 0.08, 1.0, 0.005, 1.0]),
])
def test_holm_adjusts_as_holms_procedure_does(p_values, adjusted):
  np.testing.assert_allclose(verdicts.holm(p_values), adjusted, rtol=1e-12)


def test_holm_leaves_the_garbage_collector_as_it_was():
  # statsmodels' Holm collects garbage at every call; `holm` freezes the
  # objects alive for its length, and must leave none frozen.
  frozen = gc.get_freeze_count()
  verdicts.holm([0.01, 0.2])
  assert gc.get_freeze_count() == frozen == 0


def test_holm_corrects_the_primary_effects_together():
  # Two primary effects, each p ~0.036 alone: Holm doubles the smaller,
  # so neither stays under 0.05; a secondary effect is not corrected.
  rng = np.random.default_rng(0)
  base = rng.normal(0.5, 0.1, 6)
  diffs = np.array([0.02, 0.035, -0.002, 0.03, 0.0, 0.025])
  values = {('b', s): base[s] for s in range(6)}
  for arm in ('t1', 't2', 't3'):
    values.update({(arm, s): base[s] + diffs[s] for s in range(6)})
  frame = _runs(values)
  alone = stats.ttest_1samp(diffs, 0.0).pvalue
  assert 0.025 < alone < 0.05
  effects = [verdicts.Effect(f'{arm} beats b', _FINAL, {'arm': arm},
                             {'arm': 'b'}, 1) for arm in ('t1', 't2')]
  effects.append(verdicts.Effect('t3 beats b', _FINAL, {'arm': 't3'},
                                 {'arm': 'b'}, 1, primary=False))
  results = verdicts.assess_all(frame, effects)
  assert [r.p_adjusted for r in results[:2]] == [pytest.approx(2 * alone)] * 2
  assert [r.verdict for r in results] == [
      verdicts.NOT_REPRODUCED, verdicts.NOT_REPRODUCED,
      verdicts.DIRECTION_ONLY]
  assert results[2].p_adjusted == pytest.approx(alone)


def test_a_report_lists_its_primary_effects_before_its_secondary_ones():
  # Declared secondary first (as adabest table2's protocol does): the
  # reader meets the effects the verdict is made of first, and is told
  # which clauses are not in it.
  values = {('b', s): 0.5 + 0.01 * s for s in range(5)}
  values.update({('t1', s): 0.6 + 0.01 * s for s in range(5)})
  values.update({('t2', s): 0.4 + 0.01 * s for s in range(5)})
  effects = [verdicts.Effect('t2 beats b', _FINAL, {'arm': 't2'},
                             {'arm': 'b'}, 1, primary=False),
             verdicts.Effect('t1 beats b', _FINAL, {'arm': 't1'},
                             {'arm': 'b'}, 1)]
  results = verdicts.assess_all(_runs(values), effects)
  assert [r.effect.claim for r in results] == ['t2 beats b', 't1 beats b']
  table = verdicts.effects_table(results)
  assert table['effect (paper)'].tolist() == ['t1 beats b', 't2 beats b']
  assert table['primary'].tolist() == ['yes', 'no']
  sentence = verdicts.package_sentence(results)
  assert sentence.startswith('t1 beats b: ')
  primary, secondary = sentence.split(' Secondary (not in the verdict): ')
  assert 't2' not in primary and secondary.startswith('t2 beats b: ')
  assert verdicts.package_sentence(results[:1]).startswith(
      'Secondary only (no primary effect): t2 beats b: ')


def test_unpaired_seeds_are_left_out():
  frame = _runs({('t', 0): 0.9, ('t', 1): 0.9, ('t', 2): 0.9,
                 ('b', 1): 0.5, ('b', 2): 0.5, ('b', 3): 0.5})
  assert verdicts.assess(frame, _effect()).pairs == 2


def test_a_run_is_selected_whole():
  # A run whose cohort grows matches no fixed cohort size.
  frame = _runs({('t', 0): 0.9, ('t', 1): 0.9, ('b', 0): 0.5, ('b', 1): 0.5})
  growing = frame['run'] == '/runs/t_1'
  frame.loc[growing & (frame['round'] == 3), 'clients_per_round'] = 20
  effect = verdicts.Effect('x', _FINAL, {'arm': 't', 'clients_per_round': 10},
                           {'arm': 'b', 'clients_per_round': '10'}, 1)
  assert verdicts.per_seed(frame, effect.treatment, _FINAL, 'seed') == {
      ('0',): pytest.approx(0.9)}


def test_flags_match_as_values_and_none_matches_unset():
  frame = _runs({('t', 0): 0.9, ('b', 0): 0.5})
  frame['rate'] = np.where(frame['arm'] == 't', 0.1, np.nan)
  assert len(verdicts.per_seed(frame, {'rate': '0.10'}, _FINAL, 'seed')) == 1
  assert verdicts.per_seed(frame, {'rate': None}, _FINAL, 'seed') == {
      ('0',): pytest.approx(0.5)}
  assert verdicts.per_seed(frame, {'missing_flag': '1'}, _FINAL,
                           'seed') == {}


def test_an_ambiguous_selection_is_an_error():
  frame = _runs({('t', 0): 0.9, ('b', 0): 0.5})
  with pytest.raises(ValueError, match='name more flags'):
    verdicts.per_seed(frame, {}, _FINAL, 'seed')


def test_quantities():
  run = pd.DataFrame({'round': [1, 2, 3, 4],
                      'acc': [0.2, np.nan, 0.8, 0.6],
                      'target': 0.7, 'flag': [0, 0, 1, 0]})
  assert verdicts.final('acc').of_run(run) == 0.6
  assert verdicts.peak('acc').of_run(run) == 0.8
  assert verdicts.drop_from_peak('acc').of_run(run) == pytest.approx(0.2)
  assert verdicts.area_under('acc').of_run(run) == pytest.approx(1.6 / 3)
  assert verdicts.rounds_to('acc', 'target').of_run(run) == 3
  # Never reached: censored at one past the last round, not dropped.
  assert verdicts.rounds_to('acc', 'target').of_run(
      run.assign(target=0.9)) == 5
  # A fixed level reads the same way.
  assert verdicts.rounds_to_level('acc', 0.6).of_run(run) == 3
  assert verdicts.rounds_to_level('acc', 0.9).of_run(run) == 5
  assert np.isnan(verdicts.rounds_to_level('loss', 0.6).of_run(run))
  assert verdicts.any_positive('flag').of_run(run) == 1
  assert verdicts.mean_after('acc', 3).of_run(run) == pytest.approx(0.7)
  # Examples trained when a level is first reached (evaluation rows only
  # carry the accuracy; the examples of that row); censored at the last.
  run = run.assign(examples=[10.0, 20.0, 30.0, 40.0])
  assert verdicts.examples_to_level('acc', 0.7, 'examples').of_run(run) == 30
  assert verdicts.examples_to_level('acc', 0.9, 'examples').of_run(run) == 40
  assert verdicts.median_after('acc', 1).of_run(run) == pytest.approx(0.6)


def test_exact_claims():
  frame = pd.DataFrame({'v': [1e-7]})
  check = verdicts.Exact('equal', lambda f: float(f['v'].iloc[0]),
                         lambda v: v <= 1e-5, 'at most 1e-05')
  assert verdicts.assess(frame, check).verdict == verdicts.REPRODUCED
  assert verdicts.assess(frame.assign(v=1.0), check).verdict == (
      verdicts.NOT_REPRODUCED)


@pytest.mark.parametrize('effects, expected', [
    ([verdicts.REPRODUCED, verdicts.REPRODUCED], verdicts.REPRODUCED),
    ([verdicts.REPRODUCED, verdicts.DIRECTION_ONLY], verdicts.REPRODUCED),
    ([verdicts.REPRODUCED, verdicts.NOT_REPRODUCED], verdicts.PARTLY),
    ([verdicts.PARTLY], verdicts.PARTLY),
    ([verdicts.REPRODUCED, verdicts.NOT_TESTABLE], verdicts.PARTLY),
    # Fewer than half reproduce: not PARTLY.
    ([verdicts.REPRODUCED, verdicts.NOT_REPRODUCED, verdicts.NOT_REPRODUCED],
     verdicts.NOT_REPRODUCED),
    # One reversed primary effect makes the report REVERSED, however many
    # others reproduce (a reversal no longer hides inside PARTLY).
    ([verdicts.REPRODUCED, verdicts.REPRODUCED, verdicts.REVERSED],
     verdicts.REVERSED),
    ([verdicts.REVERSED, verdicts.NOT_REPRODUCED], verdicts.REVERSED),
    ([verdicts.NOT_REPRODUCED, verdicts.NOT_TESTABLE],
     verdicts.NOT_REPRODUCED),
    ([verdicts.NOT_TESTABLE], verdicts.NOT_TESTABLE),
    ([], verdicts.NOT_TESTABLE),
])
def test_combine(effects, expected):
  assert verdicts.combine(effects) == expected


def test_a_scale_that_cannot_show_the_effect_is_not_testable():
  assert verdicts.combine([verdicts.REPRODUCED], 'needs X') == (
      verdicts.NOT_TESTABLE)


def test_the_rules_document_names_every_verdict():
  with open(os.path.join(core.REPO_DIR, verdicts.RULES_DOC)) as f:
    text = f.read()
  for verdict in verdicts.EFFECT_VERDICTS:
    assert verdict in text
  for rule in ('ttest_1samp', 'mcnemar', 'ttost', 'holm', 'Newcombe',
               'Clopper'):
    assert rule.lower() in text.lower(), rule


def _frame_of_points(points) -> pd.DataFrame:
  """The frame the points' runs would give, without running anything: one
  round each, with the `hparams.json` the driver would record for its
  command line (`flag_rules.recorded_hparams`: defaults included)."""
  rows = []
  with flagsaver.flagsaver():
    for point in points:
      args = [a for a in point.command if a.startswith('--')]
      FLAGS.unparse_flags()
      FLAGS(['run_experiment.py', *args])
      hparams = flag_rules.recorded_hparams(flag_rules.values_of(FLAGS))
      rows.append({'run': point.run_dir, 'round': 1,
                   'experiment_name': point.experiment_name,
                   **{k: (np.nan if v is None else v)
                      for k, v in hparams.items()}})
  if not FLAGS.is_parsed():
    FLAGS.mark_as_parsed()
  return pd.DataFrame(rows)


@pytest.mark.parametrize('experiment', list(reproduce.EXPERIMENTS.values()),
                         ids=lambda e: f'{e.paper}-{e.name}')
@pytest.mark.parametrize('scale', ['local', 'paper'])
def test_every_effect_names_runs_its_experiment_makes(experiment, scale,
                                                      tmp_path):
  effects = experiment.effects(scale)
  assert effects or experiment.not_testable(scale), (
      'an experiment declares an effect to test, or why it cannot')
  if experiment.measure is not None:
    return  # measured, not run: its effects read the measurement
  points = core.build_points(experiment, scale, str(tmp_path))
  frame = _frame_of_points(points)
  seeds = core.setting_for(experiment, scale).seeds
  one = verdicts.Quantity('one', lambda run: 1.0)
  for effect in effects:
    if isinstance(effect, verdicts.Exact):
      continue  # a claim on a value the runs give (a tuned rate)
    for arm in (effect.treatment, effect.baseline):
      assert verdicts.per_seed(frame, arm, one, effect.pair_by), (
          f'{effect.claim}: {arm} selects no run at scale {scale}')
    # A grid may run fewer of the seeds (`Grid.max_seeds`): every seed its
    # treatment runs then pairs.
    run_seeds = min(seeds, len(verdicts.per_seed(
        frame, effect.treatment, one, effect.pair_by)))
    result = verdicts.assess(
        frame, verdicts.Effect(effect.claim,
                               verdicts.Quantity('one', lambda run: 1.0),
                               effect.treatment, effect.baseline, 1,
                               pair_by=effect.pair_by))
    expected_pairs = run_seeds if effect.pair_by == 'seed' or (
        effect.pair_by == 'partition_seed') else result.pairs
    assert result.pairs == expected_pairs >= 1, effect.claim


def test_report_states_the_verdict_and_the_index_counts_it(tmp_path):
  experiment = reproduce.EXPERIMENTS['large_cohort', 'fig_lr_scaling']
  report = tmp_path / 'large_cohort' / experiment.name / 'README.md'
  report.parent.mkdir(parents=True)
  report.write_text(f'# x\n\n{core.VERDICT_PREFIX}{verdicts.REVERSED}.'
                    ' 1 of 1 effects REVERSED.\n\nScale `local`: 2 of 2 runs'
                    ' finished (`/r`). Each run\'s wall time from the command'
                    ' line summed: 5400 s over 2 runs (two at a time by'
                    ' default).\n')
  assert core.read_verdict(str(report)) == verdicts.REVERSED
  assert core.read_run_time(str(report)) == (2, 5400.0)
  core.write_index(list(reproduce.EXPERIMENTS.values()), str(tmp_path),
                   'large_cohort')
  index = (tmp_path / 'README.md').read_text()
  total = len(reproduce.EXPERIMENTS)
  # A report written before protocols: its verdict is exploratory.
  assert (f'{total} reports. **Confirmatory** (a frozen protocol run on its'
          f' confirmatory seeds): {total} not run yet;') in index
  assert ('| not run yet | REVERSED (rules before protocols) | 2, 1.5 h |'
          ' [large_cohort/fig_lr_scaling/README.md]') in index
  assert '1 exploratory verdicts were made before protocols' in index
  assert '(1.5 h over the reports: large_cohort 1.5 h).' in index
  assert ('the runs take about 1.5 h; two run at a time, so `make reproduce`'
          ' into one empty directory takes about 0.8 h on 2 cores.') in index
  # fig_catastrophic's grids hold some of fig_lr_scaling's runs: with both
  # reports written, the index counts those runs once among the distinct.
  lr_runs = {p.run_dir for p in core.build_points(experiment, 'local', '/r')}
  assert f'grids hold {len(lr_runs)} distinct runs of {len(lr_runs)}.' in (
      index)
  other = reproduce.EXPERIMENTS['large_cohort', 'fig_catastrophic']
  other_runs = {p.run_dir
                for p in core.build_points(other, 'local', '/r')}
  shared = len(lr_runs & other_runs)
  assert shared > 0
  other_report = tmp_path / 'large_cohort' / other.name / 'README.md'
  other_report.parent.mkdir(parents=True)
  other_report.write_text(report.read_text())
  # A confirmatory report: its verdict.json's verdicts and effect counts.
  (other_report.parent / core.VERDICT_FILE).write_text(json.dumps({
      'confirmatory': {'verdict': verdicts.REVERSED, 'effects': {
          verdicts.REPRODUCED: 2, verdicts.REVERSED: 1}},
      'exploratory': {'verdict': verdicts.PARTLY, 'effects': {
          verdicts.DIRECTION_ONLY: 3}}}))
  core.write_results_index(list(reproduce.EXPERIMENTS.values()),
                           str(tmp_path))
  index = (tmp_path / 'README.md').read_text()
  runs = len(lr_runs) + len(other_runs)
  assert f'grids hold {runs - shared} distinct runs of {runs}.' in index
  assert '(3.0 h over the reports: large_cohort 3.0 h).' in index
  # The shared runs come out of the sum at the mean run time of the later
  # report (fig_lr_scaling follows fig_catastrophic): 5400 s over its grid.
  estimate = 5400 * (2 - shared / len(lr_runs)) / 3600
  assert f'the runs take about {estimate:.1f} h;' in index
  assert estimate < 3.0 - 0.05
  assert (f'seeds): 1 REVERSED, {total - 1} not run yet; their primary'
          ' effects: 2 REPRODUCED, 1 REVERSED. **Exploratory** (development'
          ' seeds): 1 PARTLY, 1 REVERSED (rules before protocols); their'
          ' primary effects: 3 DIRECTION ONLY.') in index
  assert '| `fig_catastrophic` |' in index
  assert '| REVERSED | PARTLY |' in index
  # A report not written yet has no runs to state.
  assert '| not run yet | — | — | not run yet:' in index
  paper_index = (tmp_path / 'large_cohort' / 'README.md').read_text()
  assert ('| not run yet | REVERSED (rules before protocols) |'
          ' [fig_lr_scaling/README.md]') in paper_index


def test_a_tuning_table_is_judged_on_its_tuned_rates():
  # large_cohort table_rates: the validation clients choose FedAdam's
  # server rate; 0.001 (the paper's) reproduces, 0.1 does not.
  from reproduce import large_cohort_experiments as lc  # pylint: disable=import-outside-toplevel
  [adam] = [e for e in lc.rates_effects('local') if 'FedAdam' in e.claim]
  rows = []
  for i, (rate, accuracy) in enumerate(((0.001, 0.9), (0.01, 0.8),
                                        (0.1, 0.7))):
    for r in (1, 2):
      rows.append({'run': f'/r/{i}', 'round': r, 'server_optimizer': 'adam',
                   'server_learning_rate': rate,
                   'client_learning_rate': 0.1,
                   'validation/accuracy': accuracy * r / 2})
  frame = pd.DataFrame(rows)
  assert verdicts.assess(frame, adam).verdict == verdicts.REPRODUCED
  assert verdicts.assess(frame, adam).mean == 0.001
  frame.loc[frame['server_learning_rate'] == 0.1, 'validation/accuracy'] = 1
  result = verdicts.assess(frame, adam)
  assert (result.mean, result.verdict) == (0.1, verdicts.NOT_REPRODUCED)
  # No runs of it: not reproduced, never silently passed.
  assert verdicts.assess(frame.iloc[0:0], adam).verdict == (
      verdicts.NOT_REPRODUCED)
