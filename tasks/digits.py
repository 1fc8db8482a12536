"""scikit-learn's handwritten digits: a real image dataset that ships with the
install, for AdaBest's partitioned protocol offline.

`sklearn.datasets.load_digits` holds 1,797 real 8x8 grey-level images of the
digits 0-9 (values 0-16), bundled with scikit-learn: no download. A fixed,
stratified 80/20 split (seed 0) gives 1,437 training images, which
`tasks.partitioned_task` partitions over clients like EMNIST-L (IID or
Dirichlet, balanced or log-normal sizes, 10 % validation clients), and 360
test images. The model is AdaBest's MLP 2x100 on the flattened, standardized
image: a small non-convex task on which the papers' instability phenomena
(FedDyn's divergence, failures without clipping) can be run on a laptop.
"""

import numpy as np

from tasks import partition

NUM_CLASSES = 10
TEST_FRACTION = 0.2
SPLIT_SEED = 0


def load_splits() -> tuple[partition.CentralizedSplit,
                           partition.CentralizedSplit, int]:
  """`(train, test, num_classes)`: images `float32 [N, 8, 8, 1]`, labels
  `int32 [N]`, split per class with `SPLIT_SEED`."""
  from sklearn import datasets  # pylint: disable=g-import-not-at-top
  digits = datasets.load_digits()
  images = digits.images.astype(np.float32)[..., np.newaxis]
  labels = digits.target.astype(np.int32)
  rng = np.random.default_rng(SPLIT_SEED)
  test = np.zeros(len(labels), bool)
  for label in range(NUM_CLASSES):
    members = np.flatnonzero(labels == label)
    chosen = rng.choice(members, size=round(TEST_FRACTION * len(members)),
                        replace=False)
    test[chosen] = True
  return (partition.CentralizedSplit(x=images[~test], y=labels[~test]),
          partition.CentralizedSplit(x=images[test], y=labels[test]),
          NUM_CLASSES)
