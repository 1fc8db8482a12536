"""Bytes each client exchanges with the server per round, read off TFF types.

The cost is computed from the learning process itself, not from a per-
algorithm formula: `process.next` is walked as a TFF building block and every
intrinsic that moves data between placements is counted with the size of its
(fully defined) type:

* down: intrinsics taking a `SERVER` value to `CLIENTS`
  (`federated_broadcast`), counted once per client;
* up: intrinsics taking `CLIENTS` values to `SERVER` (`federated_sum`,
  `federated_mean`, `federated_weighted_mean`, `federated_aggregate`, the
  secure sums, ...), counting each client's contribution.

Values that stay on a client between rounds (the `client_state` input and
output of a `StatefulClientLearningProcess`) are not communication and appear
in no such intrinsic. For the algorithms of Varno et al. (2022, Appendix
C.3) this gives: FedAvg, AdaBest and FedDyn send the model down and a
model-sized update up; SCAFFOLD also sends `c` down and `c_i⁺ − c_i` up, twice
the model bytes each way. Small scalars (the round number and learning rate
the stateful algorithms broadcast, client weights, summed training metrics)
are counted too.
"""

import math
from typing import NamedTuple

import numpy as np
import tensorflow_federated as tff
from fl_common.tff_private import building_blocks


class CommunicationCost(NamedTuple):
  """Bytes per participating client per round."""

  bytes_down: int  # server -> client
  bytes_up: int  # client -> server


def type_size_bytes(type_spec: tff.Type) -> int:
  """The size in bytes of a value of `type_spec` (placement ignored).

  Raises:
    ValueError: If a tensor has an unknown shape or a variable-size dtype.
  """
  if isinstance(type_spec, tff.FederatedType):
    return type_size_bytes(type_spec.member)
  if isinstance(type_spec, tff.StructType):
    return sum(type_size_bytes(element) for element in type_spec.children())
  if isinstance(type_spec, tff.TensorType):
    dtype = np.dtype(type_spec.dtype)
    shape = tuple(type_spec.shape)
    if None in shape or dtype.kind in 'OSU':
      raise ValueError(f'Cannot size a value of type {type_spec}: its shape '
                       'must be fully defined and its dtype fixed-size.')
    return dtype.itemsize * math.prod(shape)
  raise ValueError(f'Cannot size a value of type {type_spec}.')


def _placed_parts(type_spec: tff.Type,
                  placement: tff.framework.PlacementLiteral) -> list[tff.Type]:
  """The top-level parts of `type_spec` placed at `placement`."""
  if isinstance(type_spec, tff.FederatedType):
    return [type_spec] if type_spec.placement is placement else []
  if isinstance(type_spec, tff.StructType):
    return [
        part for element in type_spec.children()
        for part in _placed_parts(element, placement)
    ]
  return []


def communication_cost(
    process: tff.learning.templates.LearningProcess) -> CommunicationCost:
  """The bytes one client sends and receives in one round of `process`.

  `process` may be any object with a `next` computation (an
  `AggregationProcess` gives what its clients send and receive). A process
  whose TFF clients are shards of clients (`fl_engine.fused`) states what
  one real client would exchange as its `client_communication_cost`, which
  is returned: a shard's own traffic says nothing of one client's.
  """
  own = getattr(process, 'client_communication_cost', None)
  if own is not None:
    return own
  bytes_down = bytes_up = 0
  pending = [process.next.to_building_block()]
  while pending:
    block = pending.pop()
    pending.extend(block.children())
    if not (isinstance(block, building_blocks.Call) and
            isinstance(block.function, building_blocks.Intrinsic) and
            block.argument is not None):
      continue
    result_type = block.type_signature
    if not isinstance(result_type, tff.FederatedType):
      continue
    argument_type = block.argument.type_signature
    if result_type.placement is tff.CLIENTS:
      bytes_down += sum(
          type_size_bytes(part)
          for part in _placed_parts(argument_type, tff.SERVER))
    elif result_type.placement is tff.SERVER:
      bytes_up += sum(
          type_size_bytes(part)
          for part in _placed_parts(argument_type, tff.CLIENTS))
  return CommunicationCost(bytes_down, bytes_up)
