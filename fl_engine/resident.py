"""A population's examples held on the worker, so that rounds send rows.

A round sends its shards to the worker; for a small model, copying the
examples there (serialized, sent, parsed) takes longer than training on
them. A fused process built with `ResidentExamples` takes shards of rows
(`fl_engine.shards.shards_from_arrays(..., rows_only=True)`: 8 bytes per
example) and its shard computation gathers each batch from the held arrays
(`fl_engine.fused.shard_source`, `fused.batch_of`). `resident_examples`
holds a task's training population, `resident_from_shards` an evaluation's
fixed clients.
"""

import atexit
import collections
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from fl_engine import scratch
from fl_engine import shards


def _holdable(array: np.ndarray) -> bool:
  """Whether `ImmutableConst` can map the array: numeric, with rows."""
  return array.dtype.kind in 'biuf' and array.ndim >= 1


class ResidentExamples:
  """A population's examples, held where the worker reads them.

  The arrays are written once, each to a raw file in a new temporary
  directory (under `directory`, default the system's), which the graph
  memory-maps (TensorFlow's `ImmutableConst`: the file's pages, shared by
  every call and read only where gathered). Constants of the graph would
  not do: TFF 0.87's TensorFlow executor materializes a computation's
  constants at every call, so a round would copy the whole population
  (`docs/benchmarks.md`). The files must be readable at the same path by the
  worker: a worker on this machine, or `directory` on a file system that
  remote workers share. They are removed by `close()` or when Python exits
  (or, after a kill, by the next `ResidentExamples` made there).

  Args:
    examples: A structure of NumPy arrays with one row per example (as the
      model's input, batched), of numeric dtypes.
    directory: Where the temporary directory is made (default: the
      system's temporary directory).

  Raises:
    ValueError: If the arrays are not numeric or differ in their rows.
  """

  def __init__(self, examples: Any, directory: Optional[str] = None):
    arrays = [np.ascontiguousarray(a) for a in tf.nest.flatten(examples)]
    if not arrays:
      raise ValueError('resident examples need at least one array.')
    for array in arrays:
      if not _holdable(array):
        raise ValueError('resident examples are numeric arrays with a row per'
                         f' example, got dtype {array.dtype} and shape'
                         f' {array.shape}.')
    rows = {len(a) for a in arrays}
    if len(rows) != 1:
      raise ValueError(f'resident examples differ in their rows: {rows}.')
    self.num_examples = rows.pop()
    self.spec = tf.nest.pack_sequence_as(
        examples, [tf.TensorSpec(a.shape, tf.as_dtype(a.dtype))
                   for a in arrays])
    # Held by this process (removed after a kill by the next one made:
    # `fl_engine.scratch`).
    owned = scratch.OwnedDirectory('resident_examples_', directory)
    self.directory = owned.path
    # Not when this object is collected: processes built on it keep only
    # the paths.
    self._remove = owned.remove
    atexit.register(self._remove)
    self.closed = False
    self._paths = []
    for i, array in enumerate(arrays):
      path = os.path.join(self.directory, f'{i}.bin')
      array.tofile(path)
      self._paths.append(path)

  @property
  def nbytes(self) -> int:
    return sum(os.path.getsize(p) for p in self._paths)

  def mapped(self) -> Any:
    """In a graph: the held arrays, memory-mapped (no copy), structured as
    `spec`; gather rows of them where they are needed (`gather`)."""
    if self.closed:
      raise ValueError('these resident examples were closed.')

    def held(spec, path):
      if spec.shape.num_elements() == 0:  # nothing to map
        return tf.zeros(spec.shape, spec.dtype)
      return tf.raw_ops.ImmutableConst(dtype=spec.dtype, shape=spec.shape,
                                       memory_region_name=path)

    return tf.nest.pack_sequence_as(self.spec, [
        held(spec, path)
        for spec, path in zip(tf.nest.flatten(self.spec), self._paths)])

  def gather(self, rows: tf.Tensor) -> Any:
    """In a graph: the examples at `rows` (int64), structured as `spec`."""
    return tf.nest.map_structure(lambda held: tf.gather(held, rows),
                                 self.mapped())

  def close(self) -> None:
    """Removes the files (processes built on them can no longer run)."""
    self._remove()
    atexit.unregister(self._remove)
    self.closed = True

  def __repr__(self) -> str:
    return (f'ResidentExamples({self.num_examples} examples, {self.nbytes} '
            f'bytes in {self.directory})')


def resident_examples(
    client_data: tff.simulation.datasets.ClientData,
    preprocess_fn: Optional[Callable[[tf.data.Dataset], tf.data.Dataset]],
) -> Optional[ResidentExamples]:
  """The examples that a fused process can hold for `client_data` so that
  rounds send rows, not examples: its shared arrays after `preprocess_fn`'s
  element-wise transform, when its clients are rows of shared arrays and
  `preprocess_fn` says what it does (as for `shards_for_round`'s NumPy
  path); else None."""
  recipe = getattr(preprocess_fn, 'batch_recipe', None)
  arrays = getattr(client_data, 'arrays', None)
  if (recipe is None or arrays is None or
      getattr(client_data, 'client_rows', None) is None):
    return None
  transform = shards.BatchRecipe(**recipe).transform
  examples = collections.OrderedDict(arrays)
  if transform is not None:
    examples = transform(examples)
  return ResidentExamples(examples)


def resident_from_shards(
    shards: Sequence[Mapping[str, Any]],
) -> Optional[tuple[ResidentExamples, list[collections.OrderedDict]]]:
  """For shards sent again and again (an evaluation's fixed clients):
  `(resident examples, the same shards as rows of them)`, every shard's
  examples concatenated in order; None if they are not numeric."""
  examples = [s['examples'] for s in shards]
  if not all(_holdable(np.asarray(a)) for a in tf.nest.flatten(examples)):
    return None
  resident = ResidentExamples(tf.nest.map_structure(
      lambda *parts: np.concatenate(parts), *examples))
  row_shards, start = [], 0
  for shard in shards:
    size = int(np.asarray(shard['batch_sizes']).sum())
    row_shards.append(collections.OrderedDict(
        rows=np.arange(start, start + size, dtype=np.int64),
        batch_sizes=np.asarray(shard['batch_sizes'], np.int64)))
    start += size
  return resident, row_shards
