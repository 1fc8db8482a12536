"""The damage matrix (`tests/damage_matrix.py`) on FedOpt (stateless; the large-cohort paper's family): each run file
truncated, flipped, deleted, another run's, an older copy, or joined by an
extra file, then resumed: refused in one line, or exact."""

import pytest

from tests import damage_matrix

_ARGS = ['--task=synthetic', '--clients_per_round=3', '--max_eval_clients=20', '--seed=3']


@pytest.fixture(scope='module')
def matrix(tmp_path_factory):
  return damage_matrix.Matrix(str(tmp_path_factory.mktemp('runs')), _ARGS)


def test_every_run_file_has_its_cases(matrix):
  damage_matrix.check_every_file_has_a_kind(matrix.base)
  kinds = {damage_matrix.kind_of(f)
           for f in damage_matrix.files_of(matrix.base)}
  assert kinds == {kind for kind, _ in damage_matrix.cases()}


@pytest.mark.parametrize('kind,damage', damage_matrix.cases())
def test_a_damaged_run_file_is_refused_or_resumes_exactly(
    matrix, tmp_path, kind, damage):
  matrix.check(str(tmp_path), kind, damage)
