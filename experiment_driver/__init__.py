"""The driver behind `run_experiment.py`: flags to builders, the training
loop, run directories and the TFF runtime."""

from fl_common import tf_environment  # Keras 2 for TFF, before TensorFlow  # pylint: disable=unused-import
