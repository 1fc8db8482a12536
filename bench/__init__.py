"""`make bench`: round times side by side with the limit (docs/benchmarks.md)."""

from fl_common import tf_environment  # Keras 2 for TFF, before TensorFlow  # pylint: disable=unused-import
