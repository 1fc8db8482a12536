"""Stack Overflow next-word prediction, the large-cohort paper's task.

Built with TFF's `create_word_prediction_task_from_datasets` (the model,
preprocessing and metrics of `tff.simulation.baselines.stackoverflow`) on
TFF's federated Stack Overflow (342,477 train, 38,758 held-out and 204,088
test users). It matches SPEC.md §1 and the paper's appendix A.1: sentences
padded or truncated to 20 words; vocabulary of the 10,000 most frequent words
plus pad, one out-of-vocabulary bucket, beginning and end of sentence
(10,004 tokens); embedding 96, one LSTM of 670 units, dense 96, dense 10,004
logits; cross-entropy loss.

The paper's accuracy "does not include padding, out-of-vocab, or beginning or
end of sentence tokens": that is TFF's metric
`accuracy_without_out_of_vocab_or_end_of_sentence` (`ACCURACY_METRIC_NAME`;
beginning of sentence never occurs as a label). TFF's metric named
`accuracy` excludes padding only.

Where this task differs from SPEC.md or the paper, and why:
* "First 1,000 sentences per client" is `max_sentences_per_client`: each
  training client keeps its first 1,000 sentences *before* shuffling and
  repeating, as in the authors' code (google-research/federated,
  `stackoverflow_word_prediction.create_preprocess_fn`: `take` then
  `shuffle`). TFF's `ClientSpec.max_elements` would take 1,000 after a
  shuffle, i.e. not the first ones; it stays available as
  `max_elements_per_client` (a per-round cap, as in the other tasks).
  Evaluation clients keep all their sentences, as in the authors' code.
* The public TFF builder loads the vocabulary with `load_word_counts()`
  ignoring `cache_dir` (always `~/.keras`); this module loads it from
  `data_dir` itself and uses TFF's `..._from_datasets` builder.
* TFF shuffles each training client with a buffer of 1,000 and no seed.
* Validation uses Stack Overflow's own held-out users, not a split of the
  training clients.
"""

from typing import Optional

import tensorflow_federated as tff
from fl_common.tff_private import word_prediction_tasks

from tasks import data_files
from tasks import tff_tasks
from tasks import validation_split

ACCURACY_METRIC_NAME = 'accuracy_without_out_of_vocab_or_end_of_sentence'
DEFAULT_TRAIN_BATCH_SIZE = 32
DEFAULT_EVAL_BATCH_SIZE = 64
SEQUENCE_LENGTH = 20
VOCAB_SIZE = 10_000
NUM_OUT_OF_VOCAB_BUCKETS = 1
MAX_SENTENCES_PER_CLIENT = 1000
# TFF caches https://storage.googleapis.com/tff-datasets-public/
# stackoverflow.sqlite.lzma decompressed under this name, and the word counts
# with Keras' get_file under this name.
_SQLITE_FILENAME = 'stackoverflow.sqlite'
_WORD_COUNTS_FILENAME = 'stackoverflow.word_count.tar.bz2'
_DATASET_NAME = 'Stack Overflow'
_LOAD_DATA_CALL = (
    'tff.simulation.datasets.stackoverflow.load_data(cache_dir=DIR)'
)
_LOAD_WORD_COUNTS_CALL = (
    'tff.simulation.datasets.stackoverflow.load_word_counts(cache_dir=DIR)'
)


def _load_data_and_vocab(
    data_dir: Optional[str], use_synthetic_data: bool
) -> tuple[
    tff.simulation.datasets.ClientData,
    tff.simulation.datasets.ClientData,
    tff.simulation.datasets.ClientData,
    list[str],
]:
  """Returns (train, held-out, test) ClientData and the vocabulary."""
  datasets = tff.simulation.datasets.stackoverflow
  if use_synthetic_data:
    synthetic_data = datasets.get_synthetic()
    word_counts = datasets.get_synthetic_word_counts()
    return synthetic_data, synthetic_data, synthetic_data, list(word_counts)
  with data_files.require_tff_cached_file(
      _DATASET_NAME, _SQLITE_FILENAME, data_dir, _LOAD_DATA_CALL
  ):
    train_data, heldout_data, test_data = datasets.load_data(
        cache_dir=data_dir
    )
  # Computed after `load_data`, which creates `data_dir`: Keras looks
  # elsewhere when its cache directory is not writable.
  word_counts_path = data_files.keras_cached_path(
      _WORD_COUNTS_FILENAME, data_dir
  )
  with data_files.require_cached_files(
      _DATASET_NAME, [word_counts_path], _LOAD_WORD_COUNTS_CALL
  ):
    word_counts = datasets.load_word_counts(
        cache_dir=data_dir, vocab_size=VOCAB_SIZE
    )
  return train_data, heldout_data, test_data, list(word_counts)


def create_stackoverflow_task(
    train_batch_size: int = DEFAULT_TRAIN_BATCH_SIZE,
    eval_batch_size: int = DEFAULT_EVAL_BATCH_SIZE,
    num_epochs: int = 1,
    max_elements_per_client: Optional[int] = None,
    data_dir: Optional[str] = None,
    use_synthetic_data: bool = False,
    validation_fraction: float = 0.2,
    seed: int = 0,
    max_sentences_per_client: Optional[int] = MAX_SENTENCES_PER_CLIENT,
) -> tff.simulation.baselines.BaselineTask:
  """Creates the Stack Overflow next-word prediction task.

  Args:
    train_batch_size: Client batch size (in sentences) for training (SPEC.md:
      32).
    eval_batch_size: Batch size for evaluation.
    num_epochs: Local epochs per round (`E`).
    max_elements_per_client: If set, each client uses at most this many
      sentences per round (after shuffling and repeating); `None`: all.
    data_dir: The directory TFF cached `stackoverflow.sqlite` and (under
      `datasets/`) `stackoverflow.word_count.tar.bz2` in (TFF's `cache_dir`);
      `None`: TFF's defaults, `~/.tff` and `~/.keras`. Nothing is downloaded.
    use_synthetic_data: Use TFF's small synthetic Stack Overflow (3 clients)
      and its synthetic word counts as vocabulary, instead of the real data.
    validation_fraction: 0 leaves the task without validation data; any value
      in (0, 1) uses Stack Overflow's own held-out users (whose size is fixed
      by the dataset, not by this fraction).
    seed: Unused (Stack Overflow's splits are fixed by TFF); accepted so every
      task takes the same arguments.
    max_sentences_per_client: Each training client keeps only its first this
      many sentences (the paper: 1,000); `None`: all.

  Returns:
    A `tff.simulation.baselines.BaselineTask`.

  Raises:
    MissingDataError: `data_dir` does not hold the dataset or word counts.
    ValueError: A batch size, `num_epochs`, `max_elements_per_client` or
      `max_sentences_per_client` is not positive, or `validation_fraction` is
      not in [0, 1).
  """
  del seed  # Stack Overflow's train/held-out/test splits are fixed by TFF.
  validation_split.check_validation_fraction(validation_fraction)
  if max_sentences_per_client is not None and max_sentences_per_client < 1:
    raise ValueError(
        'max_sentences_per_client must be positive or None, got'
        f' max_sentences_per_client={max_sentences_per_client!r}'
    )
  train_client_spec, eval_client_spec = tff_tasks.client_specs(
      train_batch_size, eval_batch_size, num_epochs, max_elements_per_client
  )
  train_data, heldout_data, test_data, vocab = _load_data_and_vocab(
      data_dir, use_synthetic_data
  )
  if max_sentences_per_client is not None:
    train_data = train_data.preprocess(
        lambda dataset: dataset.take(max_sentences_per_client)
    )
  return word_prediction_tasks.create_word_prediction_task_from_datasets(
      train_client_spec,
      eval_client_spec,
      sequence_length=SEQUENCE_LENGTH,
      vocab=vocab,
      num_out_of_vocab_buckets=NUM_OUT_OF_VOCAB_BUCKETS,
      train_data=train_data,
      test_data=test_data,
      validation_data=heldout_data if validation_fraction > 0.0 else None,
  )
