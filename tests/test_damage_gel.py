"""The damage matrix (`tests/damage_matrix.py`) on FedAvgCM with GeL
(budget-limited clients): each run file truncated, flipped, deleted, another
run's, an older copy, or joined by an extra file, then resumed: refused in
one line, or exact."""

from tests import damage_matrix

_ARGS = [
    '--task=synthetic',
    '--algorithm=fedavgcm_gel',
    '--clients_per_round=3',
    '--max_eval_clients=20',
    '--seed=3',
]

(matrix, test_every_run_file_has_its_cases,
 test_a_damaged_run_file_is_refused_or_resumes_exactly) = (
     damage_matrix.module_tests(_ARGS, gel=True))
