"""The driver behind `run_experiment.py`: flags to what to build, the one
choice of how its clients run, the training loop and run directories (the
TFF runtimes it runs on are the engine's, `fl_engine.runtime`)."""

from fl_common import tf_environment  # Keras 2 for TFF, before TensorFlow  # pylint: disable=unused-import
