"""TFF's private modules: the one door to them (TFF 0.87 is pinned).

Every module of the package that needs what TFF does not export publicly
(its `tensorflow_federated.python` tree, its protos) imports it from here,
under the same name; nothing else imports TFF's private tree
(`tests/fl_common/test_tff_private.py` checks the source), so a TFF upgrade that
moves or drops one breaks here, at import, and nowhere else. The test also
checks that each private attribute (`module._name`) read anywhere in the
package exists in the installed TFF.

Grouped by who needs them and why; `tff.*` is used wherever TFF exports
the same thing.
"""

# pylint: disable=unused-import,g-bad-import-order
# TensorFlow's environment is set before these imports by the package's
# `__init__` (`fl_common.tf_environment`), which importing this module runs
# first; not imported here, so that the environment, which drops TFF's
# default context at exit (`default_context`, which imports this module),
# and this module form no circle.

# --- Running computations (`fl_engine.runtime`,
# `fl_engine.value_transfer`, `fl_engine.worker_state`).
# TFF 0.87 has no public API to run a compiled computation on executors the
# caller owns: in this process (`in_process`, its evaluator of compiled
# building blocks, TensorFlow computations imported with TFF's own
# `tensorflow_utils`) or on `worker_binary`s it started and stops (their
# gRPC stubs, values sent once and kept there, cohorts split over workers as
# TFF's mergeable-computation context does).
from tensorflow_federated.proto.v0 import computation_pb2
from tensorflow_federated.proto.v0 import executor_pb2
from tensorflow_federated.python.common_libs import async_utils
from tensorflow_federated.python.common_libs import structure
from tensorflow_federated.python.core.backends.native import compiler
from tensorflow_federated.python.core.backends.native import mergeable_comp_compiler
from tensorflow_federated.python.core.environments.tensorflow_frontend import tensorflow_computation
from tensorflow_federated.python.core.impl.compiler import array
from tensorflow_federated.python.core.impl.compiler import intrinsic_defs
from tensorflow_federated.python.core.impl.computation import computation_impl
from tensorflow_federated.python.core.impl.context_stack import context_base
from tensorflow_federated.python.core.impl.context_stack import context_stack_impl
from tensorflow_federated.python.core.impl.execution_contexts import async_execution_context
from tensorflow_federated.python.core.impl.execution_contexts import compiler_pipeline
from tensorflow_federated.python.core.impl.execution_contexts import mergeable_comp_execution_context
from tensorflow_federated.python.core.impl.execution_contexts import sync_execution_context
from tensorflow_federated.python.core.impl.executor_stacks import python_executor_stacks
from tensorflow_federated.python.core.impl.executors import cardinalities_utils
from tensorflow_federated.python.core.impl.executors import executor_base
from tensorflow_federated.python.core.impl.executors import executor_factory
from tensorflow_federated.python.core.impl.executors import executor_value_base
from tensorflow_federated.python.core.impl.executors import executors_errors
from tensorflow_federated.python.core.impl.executors import ingestable_base
from tensorflow_federated.python.core.impl.executors import remote_executor
from tensorflow_federated.python.core.impl.executors import remote_executor_grpc_stub
from tensorflow_federated.python.core.impl.executors import value_serialization
from tensorflow_federated.python.core.impl.types import array_shape
from tensorflow_federated.python.core.impl.types import dtype_utils
from tensorflow_federated.python.core.impl.types import placements
from tensorflow_federated.python.core.impl.types import type_analysis
from tensorflow_federated.python.core.impl.types import type_conversions
from tensorflow_federated.python.core.impl.types import type_serialization
from tensorflow_federated.python.core.impl.utils import tensorflow_utils
from tensorflow_federated.python.tensorflow_libs import graph_utils
from tensorflow_federated.python.tensorflow_libs import serialization_utils

# --- A computation's intrinsics, read from its building blocks
# (`fl_common.communication`: bytes broadcast and aggregated per round).
from tensorflow_federated.python.core.impl.compiler import building_blocks

# --- Computations called outside any runtime fail with one clear error
# (`fl_common.default_context`), as TFF's own runtime-error context does.
from tensorflow_federated.python.core.impl.context_stack import runtime_error_context

# --- Lanes: clients side by side in one TensorFlow computation
# (`fl_engine.lanes`) hand TFF's model code variables that are slices of a
# stacked tensor, as TFF's functional models do with its `TensorVariable`.
from tensorflow_federated.python.core.environments.tensorflow_frontend import variable_utils

# --- FedLARS and FedLamb (`fl_common.lars`, `fl_common.lamb`) map
# their update over model weights with the helper TFF's own optimizers use.
from tensorflow_federated.python.learning.optimizers import nest_utils

# --- The papers' models and tasks, exactly as TFF's baselines build them:
# the EMNIST CNN and Stack Overflow LSTM (`bench.workloads`), the CIFAR-100
# ResNet-18 (`tasks.cifar100`), Stack Overflow's word prediction from given
# datasets (`tasks.stackoverflow`), and TFF's SQL client-data writer (the
# tests' local data files).
from tensorflow_federated.python.simulation.baselines.emnist import emnist_models
from tensorflow_federated.python.simulation.baselines.stackoverflow import word_prediction_models
from tensorflow_federated.python.simulation.baselines.stackoverflow import word_prediction_tasks
from tensorflow_federated.python.simulation.datasets import sql_client_data_utils
from tensorflow_federated.python.simulation.models import resnet_models
