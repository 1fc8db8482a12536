"""How a process's clients run: the one execution keyword of every builder.

A builder (`build_fedopt`, `build_adabest`, `build_gel`, ...) states an
algorithm; `execution=` says how its clients run, as TFF's
`loop_implementation=` says how a client loops, without changing what they
compute (`tests/test_builders_conformance.py` checks that both give the same
round for every builder):

* `PER_CLIENT` (the default): one TFF client per client, on its `tf.data`
  dataset, as TFF's own builders run (`fl_engine.client_program`,
  `fl_engine.stateful_process`);
* `OnShards(lanes, resident_examples)`: a TFF client is a shard of clients
  trained in one TensorFlow graph (`fl_engine.fused`, which says why it is
  faster; `fl_engine.fused_stateful` for clients with state), `lanes` of
  them side by side (`fl_engine.lanes`), their examples optionally held by
  the process (`fl_engine.resident`). Its `next` then takes shards
  (`fl_engine.shards`) instead of datasets.
"""

import dataclasses
from typing import Any, Optional, Union


@dataclasses.dataclass(frozen=True)
class PerClient:
  """One TFF client per client (module docstring)."""


# Not compared or hashed by value: `resident_examples` may hold arrays.
@dataclasses.dataclass(frozen=True, eq=False)
class OnShards:
  """A TFF client trains a shard of clients (module docstring).

  Attributes:
    lanes: How many of a shard's clients train side by side, vectorized
      (`fl_engine.lanes`; e.g. `lanes.auto_lanes(model_fn)`); 1: one after
      the other. Lanes need a model whose forward pass vectorizes.
    resident_examples: The population's examples held on the worker
      (`fl_engine.resident.ResidentExamples`, or NumPy arrays shaped as the
      model's input, one row per example, to hold); shards are then rows of
      them (`shards_from_arrays(..., rows_only=True)`). None: shards carry
      examples.
  """

  lanes: int = 1
  resident_examples: Optional[Any] = None

  def __post_init__(self):
    if not isinstance(self.lanes, int) or self.lanes < 1:
      raise ValueError(f'lanes must be at least 1, got {self.lanes!r}.')


Execution = Union[PerClient, OnShards]
PER_CLIENT = PerClient()


def on_shards(execution: Execution) -> bool:
  """Whether `execution` runs shards of clients.

  Raises:
    TypeError: If `execution` is neither `PerClient` nor `OnShards`.
  """
  if isinstance(execution, OnShards):
    return True
  if isinstance(execution, PerClient):
    return False
  raise TypeError('execution must be fl_engine.execution.PER_CLIENT or an'
                  f' OnShards(...), got {execution!r}.')
