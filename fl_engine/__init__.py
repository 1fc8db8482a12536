"""The execution engine: how an algorithm's clients run, beside the math.

The one composer (`compose.build_process`: every builder of the papers is
that call with its own client) and what it composes on: `execution` (the
one `execution=` keyword: per client, or on shards), the per-client client
work (`client_program`), rounds on shards of clients (`fused`, `shards`,
`lanes`, `resident`), clients with state (`stateful_process`, the
template; `fused_stateful`, on shards; `stateful_runner` and
`client_state_store`, their states between rounds), the evaluation of
clients (`per_client_evaluation`), temporary files (`scratch`), and the TFF
runtimes the computations run on (`runtime`: in this process, on a local
worker or on remote workers, with `value_transfer` and `worker_state`).

It imports the math the papers share (`fl_common`: aggregators,
optimizers, diagnostics), TFF and TensorFlow; never a paper's package,
the tasks, the driver or the experiments (`tests/test_import_graph.py`).
"""

from fl_common import tf_environment  # Keras 2 for TFF, before TensorFlow  # pylint: disable=unused-import
