"""The library the three papers' algorithms are built from.

Optimizers: the registry (`optimizers`: every client and server optimizer by
name, with its hyperparameters and tuned rates), LARS and LAMB as
`tff.learning.optimizers` (`lars`, `lamb`, over `trust_ratio_optimizer`);
schedules (`lr_schedules`: learning-rate scaling with warmup,
`cohort_schedule`: dynamic cohorts) and the straggler model (`straggler`).
Aggregation and measurement: `aggregator_wrappers`, `diagnostics` and
`diagnosed_mean` (update norm, pairwise cosine and discarded updates, with
adaptive clipping, around any family's mean), `fednova` (normalized
averaging), `normalized_update` (the server step along Δ/‖Δ‖₂),
`communication` (bytes per round, read off TFF types). Run directories:
`run_layout` (their file names and readers, for the driver, the algorithms
and the experiments). TensorFlow's environment: `tf_environment`,
`default_context` and `tff_private` (the one door to TFF's private
modules).

How clients run is not here: the execution engine (`fl_engine`: the one
composer, per client or on shards, stateful clients and their store, the
TFF runtimes) sits beside this package and imports it, never the reverse.
The paper packages (`large_cohort`, `adabest_tff`, `gel_tff`) import both,
TFF, and never each other; reading run directories, sweeps and figures are
the experiments' (`reproduce`).
"""

from fl_common import tf_environment  # Keras 2 for TFF, before TensorFlow  # pylint: disable=unused-import
