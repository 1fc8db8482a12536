"""A round's clients as shards: plain tensors that one TFF client call reads.

A shard is several clients' batches, every batch's examples concatenated
per component, plus the batch sizes; each client is closed by an empty
batch (size 0):

    OrderedDict(examples=<structure of [examples, ...] arrays>,
                batch_sizes=int64 [batches])

or, for a process that holds the population's examples on the worker
(`fl_engine.resident`: clients stored as rows of shared arrays), the rows
of those arrays in the same order, 8 bytes per example:

    OrderedDict(rows=int64 [examples], batch_sizes=int64 [batches])

`fl_engine.fused` trains a shard's clients one after the other in one
TensorFlow graph; `fl_engine.per_client_evaluation` evaluates them. The
shards are made in the driver, from the clients' tf.data pipelines
(`shards_from_datasets`, `shards_from_client_data`) or, for clients stored
as rows of shared arrays with a shuffle-and-batch pipeline, in NumPy
(`shards_from_arrays`). No tf.data pipeline then runs on the worker, and a
shard costs one call and one value, not one per client.
"""

import collections
import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff


def closing_batch(element_spec) -> tuple[tf.Tensor, ...]:
  """The empty batch that closes a client in a shard: every tensor of the
  batched `element_spec` with 0 rows."""

  def empty(spec: tf.TensorSpec) -> tf.Tensor:
    if spec.shape.rank is None or not spec.shape[1:].is_fully_defined():
      raise ValueError(
          'fused shards need batches whose shape is known but for the batch'
          f' dimension, got {spec}.')
    return tf.zeros([0, *spec.shape[1:]], spec.dtype)

  return tf.nest.map_structure(empty, element_spec)


def num_clients(shard: Mapping[str, Any]) -> int:
  """The number of clients in a shard (its closing batches)."""
  return int(np.count_nonzero(np.asarray(shard['batch_sizes']) == 0))


def auto_clients_per_shard(num_clients: int,
                           num_cores: Optional[int] = None) -> int:
  """Clients per shard for one shard per core: a worker runs as many client
  calls at once as it has cores (`num_cores` in all, over every worker;
  default this machine's)."""
  cores = num_cores or os.cpu_count() or 1
  return max(1, -(-num_clients // cores))


# The automatic shard size's cap on a shard's examples (`split_shards`): a
# shard is sent whole to its worker each round, and a call's shards are
# held there at once. 1,000 EMNIST-sized clients in one shard per core made
# 157 MB shards and a 2.3 GB worker; in shards of at most this size, sent in
# calls of at most `fl_engine.runtime.contexts.MAX_BYTES_PER_SLICE`
# (two shards, one per core), the worker's peak is below that of one call
# per client in slices of 50 clients (bench's memory section).
MAX_AUTO_SHARD_BYTES = 8 << 20


def split_shards(shards: Sequence[Mapping[str, Any]],
                 max_bytes: int) -> list[collections.OrderedDict]:
  """`shards` with each cut, at client boundaries and in order, into shards
  of at most `max_bytes` of examples (a client larger than that alone in
  its shard). The fused processes compute the same for any grouping of the
  clients into shards (up to float summation order)."""
  if max_bytes < 1:
    raise ValueError(f'max_bytes must be positive, got {max_bytes}.')
  pieces = []
  for shard in shards:
    examples = tf.nest.flatten(shard['examples'])
    batch_sizes = np.asarray(shard['batch_sizes'])
    num_examples = int(batch_sizes.sum())
    example_bytes = sum(np.asarray(a).nbytes for a in examples)
    if num_examples == 0 or example_bytes <= max_bytes:
      pieces.append(shard)
      continue
    bytes_per_example = example_bytes / num_examples
    # Per client: its last batch (the closing one) and examples so far.
    ends = np.flatnonzero(batch_sizes == 0) + 1
    rows_at = np.concatenate([[0], np.cumsum(batch_sizes)])
    start_batch, start_row = 0, 0
    for i, end in enumerate(ends):
      last = i == len(ends) - 1
      next_rows = None if last else rows_at[ends[i + 1]]
      if not last and (next_rows - start_row) * bytes_per_example <= max_bytes:
        continue  # The next client still fits in this piece.
      end_row = rows_at[end]
      pieces.append(collections.OrderedDict(
          examples=tf.nest.map_structure(lambda a: a[start_row:end_row],
                                         shard['examples']),
          batch_sizes=batch_sizes[start_batch:end]))
      start_batch, start_row = end, end_row
  return pieces


def pooled(shard: Mapping[str, Any],
           batch_size: int) -> collections.OrderedDict:
  """`shard`'s clients as one client: the same examples (or rows) in the
  same order, in batches of `batch_size` (the last may be shorter), closed
  once.

  Evaluating it (`per_client_evaluation`) gives the metrics the clients'
  unfinalized metrics summed would (TFF's `sum_then_finalize`; a count of
  batches excepted), in a few large batches instead of a loop over many
  small clients, and no per-client metrics.

  Raises:
    ValueError: If `batch_size` < 1.
  """
  if batch_size < 1:
    raise ValueError(f'batch_size must be >= 1, got {batch_size}.')
  num_examples = int(np.sum(shard['batch_sizes']))
  batch_sizes = _batches(num_examples, batch_size) + [0]
  result = collections.OrderedDict(shard)
  result['batch_sizes'] = np.asarray(batch_sizes, np.int64)
  return result


def _groups(items: Sequence[Any], size: int) -> list[Sequence[Any]]:
  if size < 1:
    raise ValueError(f'clients_per_shard must be >= 1, got {size}.')
  if not items:
    raise ValueError('a round needs at least one client.')
  return [items[i:i + size] for i in range(0, len(items), size)]


def stack_shard(shard: tf.data.Dataset) -> collections.OrderedDict:
  """Reads a shard's batches (each client's closed by an empty batch) into
  the tensors the fused process takes: `OrderedDict(examples=<every batch's
  examples concatenated, per component>, batch_sizes=int64 [batches])`."""
  # ragged_batch reads many batches per call, in C++; its row lengths are
  # the batch sizes, 0 for a closing batch.
  chunks = list(shard.ragged_batch(_BATCHES_PER_READ))
  if not chunks:
    raise ValueError('a shard holds at least its closing batches.')
  batch_sizes = np.concatenate(
      [tf.nest.flatten(c)[0].row_lengths().numpy() for c in chunks])
  examples = tf.nest.map_structure(
      lambda *parts: np.concatenate([p.values.numpy() for p in parts]),
      *chunks)
  return collections.OrderedDict(examples=examples,
                                 batch_sizes=batch_sizes.astype(np.int64))


_BATCHES_PER_READ = 4096


@dataclasses.dataclass(frozen=True)
class BatchRecipe:
  """A client pipeline that is only shuffle, repeat, take and batch, in
  TFF's tasks' order (`tasks.synthetic`), or bootstrapped epochs
  (`tasks.partitioned_task`), and an element-wise map: what
  `shards_from_arrays` does in NumPy.

  Attributes:
    batch_size: Examples per batch (the last one of a client may be short).
    num_epochs: Passes over the client's examples, each in a new order.
    shuffle: Whether each pass is a uniform random permutation (a shuffle
      buffer at least the client's size); else the stored order.
    max_elements: Examples taken after the passes (None: all).
    fill_last_batch: Whether each pass is topped up to whole batches with
      examples drawn uniformly with replacement from the client's
      (`tasks.partitioned_task.bootstrapped_epochs`).
    transform: The pipeline's element-wise map in NumPy, applied to a
      shard's gathered examples (`OrderedDict` of arrays -> the same), or
      None.
  """

  batch_size: int
  num_epochs: int = 1
  shuffle: bool = True
  max_elements: Optional[int] = None
  fill_last_batch: bool = False
  transform: Optional[Callable[[collections.OrderedDict],
                               collections.OrderedDict]] = None


def _pass_order(rows: np.ndarray, recipe: BatchRecipe,
                rng: np.random.Generator) -> np.ndarray:
  """One run of the recipe's pipeline over a client's rows: the example
  order (epochs, each permuted if shuffled and topped up if filled, cut at
  `max_elements`)."""
  passes = []
  for _ in range(recipe.num_epochs):
    passes.append(rng.permutation(rows) if recipe.shuffle else rows)
    if recipe.fill_last_batch and len(rows):
      passes.append(rows[rng.integers(0, len(rows),
                                      size=-len(rows) % recipe.batch_size)])
  order = np.concatenate(passes) if passes else rows[:0]
  if recipe.max_elements is not None:
    order = order[:recipe.max_elements]
  return order


def _batches(num_examples: int, batch_size: int) -> list[int]:
  full, rest = divmod(num_examples, batch_size)
  return [batch_size] * full + ([rest] if rest else [])


def shards_from_arrays(
    examples: Mapping[str, np.ndarray],
    client_rows: Sequence[np.ndarray],
    recipe: BatchRecipe,
    clients_per_shard: int,
    rng: np.random.Generator,
    steps: Optional[Sequence[int]] = None,
    rows_only: bool = False,
) -> list[collections.OrderedDict]:
  """The fused process's client data for clients stored as rows of shared
  arrays (client `k` owns rows `client_rows[k]` of every array), batched by
  `recipe` in NumPy: microseconds per client, where a tf.data pipeline
  takes about a millisecond (it is built, then read batch by batch).

  With `steps`, client `k` gets exactly `steps[k]` batches, the pipeline's
  output repeated (each run a new order) and cut, as
  `gel_tff.budgets.limit_to_steps` does; a client without examples gets
  none.

  With `rows_only`, a shard holds the rows of `examples` instead of the
  examples (`OrderedDict(rows, batch_sizes)`), for a process that holds
  `resident_examples(examples, recipe)`: the same batches, drawn with the
  same `rng`.

  Raises:
    ValueError: If `clients_per_shard` < 1 or there are no clients.
  """
  clients = list(client_rows)
  if steps is not None and len(steps) != len(clients):
    raise ValueError(f'{len(steps)} step counts for {len(clients)} clients.')
  budgets = list(steps) if steps is not None else [None] * len(clients)
  shards = []
  for group in _groups(list(zip(clients, budgets)), clients_per_shard):
    indices, batch_sizes = [], []
    for rows, budget in group:
      rows = np.asarray(rows)
      order = _pass_order(rows, recipe, rng)
      sizes = _batches(len(order), recipe.batch_size)
      if budget is not None:
        orders = [order]
        while len(sizes) < budget and len(order):
          orders.append(_pass_order(rows, recipe, rng))
          sizes += _batches(len(orders[-1]), recipe.batch_size)
        sizes = sizes[:budget]
        order = np.concatenate(orders)[:sum(sizes)]
      batch_sizes += sizes + [0]
      indices.append(order)
    flat = np.concatenate(indices).astype(np.int64)
    if rows_only:
      shards.append(collections.OrderedDict(
          rows=flat, batch_sizes=np.asarray(batch_sizes, np.int64)))
      continue
    gathered = collections.OrderedDict(
        (name, array[flat]) for name, array in examples.items())
    if recipe.transform is not None:
      gathered = recipe.transform(gathered)
    shards.append(collections.OrderedDict(
        examples=gathered, batch_sizes=np.asarray(batch_sizes, np.int64)))
  return shards


def shards_from_datasets(datasets: Sequence[tf.data.Dataset],
                         clients_per_shard: int
                         ) -> list[collections.OrderedDict]:
  """The fused process's client data from batched client datasets, in
  order: shards of `clients_per_shard` clients (the last may be shorter).

  Each shard is read through one tf.data pipeline over the clients'
  datasets (`tf.data.experimental.to_variant`), not a chain of
  concatenations, whose reads grow with the shard's length.

  Raises:
    ValueError: If `clients_per_shard` < 1 or there are no datasets.
  """
  groups = _groups(list(datasets), clients_per_shard)
  spec = datasets[0].element_spec
  closing = tf.data.Dataset.from_tensors(closing_batch(spec))
  shards = []
  for group in groups:
    variants = tf.stack([tf.data.experimental.to_variant(d) for d in group])
    shard = tf.data.Dataset.from_tensor_slices(variants).flat_map(
        lambda v: tf.data.experimental.from_variant(v, spec).concatenate(
            closing))
    shards.append(stack_shard(shard))
  return shards


def shards_from_client_data(
    client_data: tff.simulation.datasets.ClientData,
    preprocess_fn: Optional[Callable[[tf.data.Dataset], tf.data.Dataset]],
    client_ids: Sequence[str],
    clients_per_shard: int,
    steps: Optional[Sequence[int]] = None,
) -> list[collections.OrderedDict]:
  """The fused process's client data for `client_ids` of `client_data`
  (with `steps`, exactly `steps[k]` batches of client `k`, cycling, as
  `gel_tff.budgets.limit_to_steps`).

  One pipeline per shard maps the client ids through the ClientData's
  `serializable_dataset_fn` and `preprocess_fn` (traced once, not once per
  client as `create_tf_dataset_for_client` is). The pipeline's ops are those
  of the per-client datasets, with one difference: an unseeded shuffle in
  `preprocess_fn` is traced once per shard, so the shard's clients of equal
  size get the same permutation of their own examples (a seeded pipeline,
  e.g. `tasks.partitioned_task`'s, is unaffected).

  Raises:
    ValueError: If `clients_per_shard` < 1 or there are no clients.
  """
  dataset_fn = client_data.serializable_dataset_fn
  preprocess_fn = preprocess_fn or (lambda d: d)
  spec = preprocess_fn(dataset_fn(client_ids[0])).element_spec
  closing = tf.data.Dataset.from_tensors(closing_batch(spec))
  if steps is not None and len(steps) != len(client_ids):
    raise ValueError(
        f'{len(steps)} step counts for {len(client_ids)} clients.')

  def client_batches(client_id, client_steps):
    dataset = preprocess_fn(dataset_fn(client_id))
    if steps is not None:
      dataset = dataset.repeat().take(client_steps)
    return dataset.concatenate(closing)

  budgets = list(steps) if steps is not None else [0] * len(client_ids)
  shards = []
  for group in _groups(list(zip(client_ids, budgets)), clients_per_shard):
    ids, group_steps = zip(*group)
    shard = tf.data.Dataset.from_tensor_slices(
        (list(ids), np.asarray(group_steps, np.int64))).flat_map(
            client_batches)
    shards.append(stack_shard(shard))
  return shards


def shards_for_round(
    client_data: tff.simulation.datasets.ClientData,
    preprocess_fn: Optional[Callable[[tf.data.Dataset], tf.data.Dataset]],
    client_ids: Sequence[str],
    clients_per_shard: int,
    rng: np.random.Generator,
    steps: Optional[Sequence[int]] = None,
    max_shard_bytes: Optional[int] = None,
    rows_only: bool = False,
) -> list[collections.OrderedDict]:
  """A round's shards: in NumPy (`shards_from_arrays`, with `rng`) when the
  clients are rows of shared arrays (`client_data.arrays`,
  `client_rows(id)`) and `preprocess_fn` says what it does
  (`preprocess_fn.batch_recipe`, a `BatchRecipe`'s fields, as
  `tasks.synthetic`'s and `tasks.partitioned_task`'s); else through the
  clients' tf.data pipelines (`shards_from_client_data`; one pipeline per
  client for TFF's `TestClientData`, whose `serializable_dataset_fn` bakes
  every client's examples into each trace: 12 GB and 80 s for 1,000 EMNIST
  clients). With `max_shard_bytes`, shards are then cut to that size
  (`split_shards`). With `rows_only` (for a process holding
  `resident_examples(client_data, preprocess_fn)`), shards are rows of the
  arrays, not cut.

  Raises:
    ValueError: With `rows_only`, if the clients are not rows of shared
      arrays with a batch recipe.
  """
  recipe = getattr(preprocess_fn, 'batch_recipe', None)
  client_rows = getattr(client_data, 'client_rows', None)
  if rows_only and (recipe is None or client_rows is None):
    raise ValueError('rows_only needs clients stored as rows of shared arrays'
                     ' and a pipeline with a batch recipe.')
  if recipe is not None and client_rows is not None:
    shards = shards_from_arrays(
        client_data.arrays, [client_rows(i) for i in client_ids],
        BatchRecipe(**recipe), clients_per_shard, rng, steps, rows_only)
    if rows_only:
      return shards
  elif isinstance(client_data, tff.simulation.datasets.TestClientData):
    preprocess_fn = preprocess_fn or (lambda d: d)
    datasets = [preprocess_fn(client_data.create_tf_dataset_for_client(i))
                for i in client_ids]
    if steps is not None:
      datasets = [d.repeat().take(n) for d, n in zip(datasets, steps)]
    shards = shards_from_datasets(datasets, clients_per_shard)
  else:
    shards = shards_from_client_data(client_data, preprocess_fn, client_ids,
                                     clients_per_shard, steps)
  if max_shard_bytes is not None:
    shards = split_shards(shards, max_shard_bytes)
  return shards
