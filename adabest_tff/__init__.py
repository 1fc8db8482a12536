"""AdaBest, FedDyn and SCAFFOLD (Varno et al. 2022) on TFF: the public API.

Each `build_<name>(model_fn, ...)` returns a `StatefulClientLearningProcess`,
whose clients keep a state between rounds; `StatefulClientRunner` runs it
round by round from client ids and datasets, with the states in a
`ClientStateStore` (the stateful-client template is the library's,
`fl_engine.stateful_process`, open to any family; re-exported here),
composed by the library's one composer (`fl_engine.compose`) as its
`execution=` says (`fl_engine.execution`).
`<name>_algorithm(model_weights_type, ...)` is the same algorithm before
composition (a `fl_engine.stateful_process.StatefulAlgorithm`: its client
steps, client state and server values), whose arithmetic `adabest_tff.cost`
counts as the paper's cost tables do.
"""

from fl_common import tf_environment  # Keras 2 for TFF, before TensorFlow  # pylint: disable=unused-import

from adabest_tff.adabest import adabest_algorithm
from adabest_tff.adabest import build_adabest
from fl_engine.client_state_store import ClientStateStore
from adabest_tff.feddyn import build_feddyn
from adabest_tff.feddyn import feddyn_algorithm
from fl_engine.stateful_runner import StatefulClientRunner
from adabest_tff.scaffold import build_scaffold
from adabest_tff.scaffold import scaffold_algorithm
from fl_engine.stateful_process import StatefulClientLearningProcess

__all__ = [
    'ClientStateStore',
    'StatefulClientLearningProcess',
    'StatefulClientRunner',
    'adabest_algorithm',
    'build_adabest',
    'build_feddyn',
    'build_scaffold',
    'feddyn_algorithm',
    'scaffold_algorithm',
]
