"""Shared by the fused-round tests: small client datasets (uneven sizes, an
optional NaN client) and a float comparison of nested results."""

import collections

import numpy as np
import tensorflow as tf

NUM_FEATURES = 3


def client_datasets(sizes, nan_client=None, batch_size=2, seed=0):
  rng = np.random.default_rng(seed)
  datasets = []
  for k, size in enumerate(sizes):
    x = rng.normal(size=(size, NUM_FEATURES)).astype(np.float32)
    y = rng.normal(size=(size, 1)).astype(np.float32)
    if k == nan_client:
      x[0, 0] = np.nan
    datasets.append(tf.data.Dataset.from_tensor_slices(
        collections.OrderedDict(x=x, y=y)).batch(batch_size))
  return datasets


def assert_close(a, b):
  flat_a, flat_b = tf.nest.flatten(a), tf.nest.flatten(b)
  assert len(flat_a) == len(flat_b)
  for x, y in zip(flat_a, flat_b):
    np.testing.assert_allclose(np.asarray(x, np.float64),
                               np.asarray(y, np.float64), rtol=1e-5,
                               atol=1e-6)
