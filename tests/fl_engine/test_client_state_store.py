"""The client-state store: fresh states, exact resume, atomic writes, memory."""

import collections
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from fl_engine import client_state_store

FRESH = collections.OrderedDict(
    estimate=[np.zeros((2, 3), np.float32), np.zeros((3,), np.float32)],
    last_round=np.int32(0))


def state_for(client_id, round_num):
  """A state that identifies its client and round."""
  value = float(round_num) + (sum(map(ord, client_id)) % 97) / 100.0
  return collections.OrderedDict(
      estimate=[np.full((2, 3), value, np.float32),
                np.full((3,), -value, np.float32)],
      last_round=np.int32(round_num))


def assert_state_equal(actual, expected):
  np.testing.assert_array_equal(actual['estimate'][0], expected['estimate'][0])
  np.testing.assert_array_equal(actual['estimate'][1], expected['estimate'][1])
  assert actual['last_round'] == expected['last_round']
  assert actual['estimate'][0].dtype == np.float32
  assert np.asarray(actual['last_round']).dtype == np.int32


def files_of(directory):
  return sorted(n for n in os.listdir(directory)
                if n != client_state_store.MANIFEST_NAME)


def test_missing_clients_get_fresh_states(tmp_path):
  store = client_state_store.ClientStateStore(str(tmp_path), FRESH)
  store.save(['a'], [state_for('a', 1)], 1)
  loaded = store.load(['new', 'a'])
  assert_state_equal(loaded[0], FRESH)
  assert_state_equal(loaded[1], state_for('a', 1))


def test_states_survive_reopening_with_unusual_client_ids(tmp_path):
  ids = ['a/b', '..', 'x@00000001', 'client-7.npz', 'é']
  store = client_state_store.ClientStateStore(str(tmp_path), FRESH)
  store.save(ids, [state_for(i, 3) for i in ids], 3)
  store.commit(3)
  reopened = client_state_store.ClientStateStore(str(tmp_path), FRESH)
  for client_id, state in zip(ids, reopened.load(ids)):
    assert_state_equal(state, state_for(client_id, 3))


def test_restore_after_crash_discards_rounds_after_the_checkpoint(tmp_path):
  store = client_state_store.ClientStateStore(str(tmp_path), FRESH)
  cohorts = {1: ['a', 'b'], 2: ['b', 'c'], 3: ['a', 'c'], 4: ['a', 'd']}
  for round_num in (1, 2):
    ids = cohorts[round_num]
    store.save(ids, [state_for(i, round_num) for i in ids], round_num)
  store.commit(2)  # checkpoint at round 2
  for round_num in (3, 4):  # run on, then crash before the next checkpoint
    ids = cohorts[round_num]
    store.save(ids, [state_for(i, round_num) for i in ids], round_num)
  del store

  resumed = client_state_store.ClientStateStore(str(tmp_path), FRESH)
  resumed.restore(2)
  states = dict(zip('abcd', resumed.load(list('abcd'))))
  assert_state_equal(states['a'], state_for('a', 1))
  assert_state_equal(states['b'], state_for('b', 2))
  assert_state_equal(states['c'], state_for('c', 2))
  assert_state_equal(states['d'], FRESH)
  # Only the states as of round 2 are left on disk.
  assert len(files_of(tmp_path)) == 3
  assert resumed.committed_round == 2


def test_states_of_a_round_never_committed_are_not_restored(tmp_path):
  store = client_state_store.ClientStateStore(str(tmp_path), FRESH)
  store.save(['a'], [state_for('a', 1)], 1)
  store.commit(1)
  store.save(['a', 'b'], [state_for('a', 2), state_for('b', 2)], 2)
  # The driver saved its round-2 checkpoint, then died before commit(2):
  # that checkpoint was never recorded and is dropped; round 1 resumes.
  resumed = client_state_store.ClientStateStore(str(tmp_path), FRESH)
  assert resumed.problem_as_of(2) is not None
  with pytest.raises(ValueError, match='not recorded'):
    resumed.restore(2)
  assert resumed.problem_as_of(1) is None
  resumed.restore(1)
  assert_state_equal(resumed.load(['a'])[0], state_for('a', 1))
  assert_state_equal(resumed.load(['b'])[0], FRESH)
  assert files_of(tmp_path) == ['client-a@00000001.state']


def test_commit_deletes_superseded_versions(tmp_path):
  store = client_state_store.ClientStateStore(str(tmp_path), FRESH)
  for round_num in (1, 2, 3):
    store.save(['a'], [state_for('a', round_num)], round_num)
  store.save(['b'], [state_for('b', 2)], 2)
  assert len(files_of(tmp_path)) == 4
  store.commit(3)
  assert len(files_of(tmp_path)) == 2
  assert_state_equal(store.load(['a'])[0], state_for('a', 3))


def test_failed_write_leaves_previous_version_and_no_partial_file(
    tmp_path, monkeypatch):
  store = client_state_store.ClientStateStore(str(tmp_path), FRESH)
  store.save(['a'], [state_for('a', 1)], 1)
  store.commit(1)
  before = files_of(tmp_path)

  def crash_midway(file, leaves):
    file.write(b'half a file')
    raise OSError('disk gone')

  monkeypatch.setattr(client_state_store.ClientStateStore, '_write',
                      staticmethod(crash_midway))
  with pytest.raises(OSError):
    store.save(['a'], [state_for('a', 2)], 2)
  monkeypatch.undo()
  assert files_of(tmp_path) == before
  reopened = client_state_store.ClientStateStore(str(tmp_path), FRESH)
  assert_state_equal(reopened.load(['a'])[0], state_for('a', 1))


def test_commit_removes_temporary_files_left_by_a_killed_writer(tmp_path):
  store = client_state_store.ClientStateStore(str(tmp_path), FRESH)
  store.save(['a'], [state_for('a', 1)], 1)
  store.commit(1)
  (tmp_path / '.tmp-killed').write_bytes(b'partial')
  reopened = client_state_store.ClientStateStore(str(tmp_path), FRESH)
  assert_state_equal(reopened.load(['a'])[0], state_for('a', 1))
  reopened.commit(1)
  assert not (tmp_path / '.tmp-killed').exists()


def test_only_the_current_cohort_is_held_in_memory(tmp_path):
  store = client_state_store.ClientStateStore(str(tmp_path), FRESH)
  population = [f'client_{k}' for k in range(40)]
  rng = np.random.default_rng(0)
  for round_num in range(1, 16):
    cohort = list(rng.choice(population, size=3, replace=False))
    states = store.load(cohort)
    assert sorted(store.cached_client_ids) == sorted(cohort)
    new_states = [state_for(i, round_num) for i in cohort]
    store.save(cohort, new_states, round_num)
    assert len(store.cached_client_ids) == 3
    del states
  seen = {n.split('@')[0] for n in files_of(tmp_path)}
  assert len(seen) > 3  # the other clients' states are on disk only


def test_bad_calls_raise_value_error(tmp_path):
  store = client_state_store.ClientStateStore(str(tmp_path), FRESH)
  store.save(['a'], [state_for('a', 2)], 2)
  store.commit(2)
  with pytest.raises(ValueError, match='as of round 1 are not recorded'):
    store.restore(1)
  with pytest.raises(ValueError, match='round_num=1'):
    store.commit(1)
  with pytest.raises(ValueError, match='round_num=2'):
    store.save(['a'], [state_for('a', 2)], 2)
  with pytest.raises(ValueError, match='2 client ids and 1 states'):
    store.save(['a', 'b'], [state_for('a', 3)], 3)
  wrong_shape = state_for('a', 3)
  wrong_shape['estimate'][1] = np.zeros((4,), np.float32)
  with pytest.raises(ValueError, match="client 'a'"):
    store.save(['a'], [wrong_shape], 3)


def test_restore_goes_back_to_any_retained_commit(tmp_path):
  # Checkpoints at rounds 2, 4 and 6 with three kept: after the checkpoint
  # of round 6 is lost, the states as of round 4 are exactly those the run
  # had then, and an uninterrupted run from there writes the same files.
  store = client_state_store.ClientStateStore(str(tmp_path), FRESH,
                                              keep_commits=3)
  cohorts = {1: ['a', 'b'], 2: ['b'], 3: ['a', 'c'], 4: ['b'], 5: ['a'],
             6: ['c', 'a']}
  as_of = {}
  for round_num, cohort in cohorts.items():
    store.load(cohort)
    store.save(cohort, [state_for(i, round_num) for i in cohort], round_num)
    if round_num % 2 == 0:
      store.commit(round_num)
      as_of[round_num] = store.load(['a', 'b', 'c'])
  assert store.committed_rounds == [2, 4, 6]
  store.restore(4)
  assert store.committed_rounds == [2, 4]
  reopened = client_state_store.ClientStateStore(str(tmp_path), FRESH,
                                                 keep_commits=3)
  for got, want in zip(reopened.load(['a', 'b', 'c']), as_of[4]):
    for g, w in zip(tf.nest.flatten(got), tf.nest.flatten(want)):
      np.testing.assert_array_equal(g, w)
  reopened.restore(2)
  for got, want in zip(reopened.load(['a', 'b', 'c']), as_of[2]):
    for g, w in zip(tf.nest.flatten(got), tf.nest.flatten(want)):
      np.testing.assert_array_equal(g, w)
  reopened.restore(0)  # the start: every client fresh
  assert not files_of(tmp_path)


def test_one_kept_commit_keeps_only_the_latest_versions(tmp_path):
  store = client_state_store.ClientStateStore(str(tmp_path), FRESH)
  store.save(['a'], [state_for('a', 1)], 1)
  store.commit(1)
  store.save(['a'], [state_for('a', 2)], 2)
  store.commit(2)
  assert [n for n in files_of(tmp_path) if n.startswith('client-')] == [
      'client-a@00000002.state']


def test_rounds_write_without_fsync_and_a_commit_syncs_what_it_keeps(
    tmp_path, monkeypatch):
  # A round writes every client of its cohort: fsyncing each would take
  # longer than the round. A commit makes the states it keeps durable
  # (each kept file, the directory's renames, the manifest) before it
  # names their round.
  synced = []
  real_fsync = os.fsync

  def fsync(fd):
    synced.append(os.readlink(f'/proc/self/fd/{fd}'))
    real_fsync(fd)

  monkeypatch.setattr(os, 'fsync', fsync)
  store = client_state_store.ClientStateStore(str(tmp_path), FRESH)
  ids = ['a', 'b', 'c']
  store.save(ids, [state_for(i, 1) for i in ids], 1)
  store.save(['a'], [state_for('a', 2)], 2)
  assert not synced
  store.commit(2)
  kept = [os.path.join(str(tmp_path), name) for name in files_of(tmp_path)]
  assert len(kept) == 3  # a@2, b@1, c@1: a@1 is no longer used
  assert set(kept) <= set(synced)
  assert str(tmp_path) in synced  # the renames
  assert synced.index(str(tmp_path)) < len(synced) - 1  # manifest last
  synced.clear()
  store.commit(2)  # nothing new to sync but the manifest
  assert not set(kept) & set(synced)


def _committed_store(directory, owner='run-a'):
  """A store whose round-2 commit records a@1, b@2, a@2 (a@1 superseded)."""
  store = client_state_store.ClientStateStore(str(directory), FRESH,
                                              keep_commits=2, owner=owner)
  store.save(['a', 'b'], [state_for('a', 1), state_for('b', 1)], 1)
  store.commit(1)
  store.save(['a', 'c'], [state_for('a', 2), state_for('c', 2)], 2)
  store.commit(2)
  return store


def _reopened(directory, owner='run-a'):
  return client_state_store.ClientStateStore(str(directory), FRESH,
                                             keep_commits=2, owner=owner)


def test_an_intact_store_verifies_and_its_summary_names_the_states(tmp_path):
  store = _committed_store(tmp_path)
  assert _reopened(tmp_path).problem_as_of(2) is None
  assert _reopened(tmp_path).problem_as_of(1) is None
  assert store.summary_as_of(2)['count'] == 3  # a@2, b@1, c@2
  assert store.summary_as_of(1)['count'] == 2
  assert store.summary_as_of(0) == client_state_store.summary_of(0, {})
  assert store.summary_as_of(2) != store.summary_as_of(1)


@pytest.mark.parametrize('damage', [
    'another_clients_file', 'another_runs_file', 'extra_version',
    'not_a_state_name'])
def test_a_file_the_manifest_does_not_list_is_refused_never_adopted(
    tmp_path, damage):
  _committed_store(tmp_path / 'a')
  other = _committed_store(tmp_path / 'b', owner='run-b')
  del other
  directory = tmp_path / 'a'
  if damage == 'another_clients_file':  # c never took part in round 1
    target = 'client-c@00000001.state'
    (directory / target).write_bytes(
        (directory / 'client-b@00000001.state').read_bytes())
  elif damage == 'another_runs_file':
    target = 'client-d@00000002.state'
    (directory / target).write_bytes(
        (tmp_path / 'b' / 'client-a@00000002.state').read_bytes())
  elif damage == 'extra_version':
    target = 'client-b@00000002.state'
    (directory / target).write_bytes(
        (directory / 'client-b@00000001.state').read_bytes())
  else:
    target = 'notes.txt'
    (directory / target).write_text('x')
  before = (directory / client_state_store.MANIFEST_NAME).read_bytes()
  store = _reopened(directory)
  for round_num in (1, 2):
    problem = store.problem_as_of(round_num)
    assert problem is not None and target in problem, problem
  # Opening and checking wrote nothing: the file was not adopted.
  assert (directory / client_state_store.MANIFEST_NAME).read_bytes() == before


def test_another_runs_store_and_a_missing_version_are_refused(tmp_path):
  _committed_store(tmp_path / 'a')
  _committed_store(tmp_path / 'b', owner='run-b')
  problem = _reopened(tmp_path / 'b').problem_as_of(2)
  assert 'belongs to another run (run-b, this is run-a)' in problem
  (tmp_path / 'a' / 'client-c@00000002.state').unlink()
  problem = _reopened(tmp_path / 'a').problem_as_of(2)
  assert problem.endswith('client-c@00000002.state is missing')
  assert _reopened(tmp_path / 'a').problem_as_of(1) is None  # c not used


def test_files_after_the_last_commit_are_a_crashs_and_restore_removes_them(
    tmp_path):
  store = _committed_store(tmp_path)
  store.save(['b', 'e'], [state_for('b', 3), state_for('e', 3)], 3)
  resumed = _reopened(tmp_path)
  assert resumed.problem_as_of(2) is None
  resumed.restore(2)
  assert 'client-e@00000003.state' not in files_of(tmp_path)
  assert_state_equal(resumed.load(['e'])[0], FRESH)


def test_a_store_of_an_earlier_version_is_refused_until_upgraded_once(
    tmp_path, capsys):
  # Earlier versions wrote one .npz per state and a manifest without
  # checksums or owner.
  for client_id, round_num in (('a', 1), ('a', 2), ('b', 1)):
    leaves = tf.nest.flatten(state_for(client_id, round_num))
    np.savez(tmp_path / f'client-{client_id}@{round_num:08d}.npz',
             **{f'leaf_{k}': leaf for k, leaf in enumerate(leaves)})
  (tmp_path / client_state_store.MANIFEST_NAME).write_text(
      '{"committed_round": 2}')
  store = _reopened(tmp_path)
  assert 'earlier version' in store.problem_as_of(2)
  assert files_of(tmp_path)[0].endswith('.npz')  # opening changed nothing
  steps = client_state_store.upgrade(str(tmp_path), 'run-a')
  assert len(steps) == 7  # 3 converted, 3 recorded, the owner
  assert 'converted client-a@00000001.npz' in capsys.readouterr().out
  assert files_of(tmp_path) == ['client-a@00000001.state',
                                'client-a@00000002.state',
                                'client-b@00000001.state']
  store = _reopened(tmp_path)
  assert store.problem_as_of(2) is None
  store.restore(2)
  a, b = store.load(['a', 'b'])
  assert_state_equal(a, state_for('a', 2))
  assert_state_equal(b, state_for('b', 1))
  assert client_state_store.upgrade(str(tmp_path), 'run-a') == []  # once
  manifest = json.loads((tmp_path / client_state_store.MANIFEST_NAME
                         ).read_text())
  assert manifest['owner'] == 'run-a' and len(manifest['upgraded']) == 1
  (tmp_path / 'client-c@00000001.state').write_bytes(b'not a state')
  assert 'client-c@00000001.state' in _reopened(tmp_path).problem_as_of(2)
