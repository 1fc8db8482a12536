"""The library the three papers' algorithms are built from.

Optimizers: the registry (`optimizers`: every client and server optimizer by
name, with its hyperparameters and tuned rates), LARS and LAMB as
`tff.learning.optimizers` (`lars`, `lamb`, over `trust_ratio_optimizer`);
schedules (`lr_schedules`: learning-rate scaling with warmup,
`cohort_schedule`: dynamic cohorts) and the straggler model (`straggler`).
Stateful clients, for any family: the learning process whose clients keep a
state (`stateful_process`), its runner (`stateful_runner`), the states on
disk (`client_state_store`) and the same on shards (`fused_stateful`).
Aggregation and measurement: `aggregator_wrappers`, `diagnostics` and
`diagnosed_mean` (update norm, pairwise cosine and discarded updates, with
adaptive clipping, around any family's mean), `normalized_update` (the
server step along Δ/‖Δ‖₂), `per_client_evaluation`, `communication` (bytes
per round, read off TFF types). Run directories: `run_layout` (their file
names and readers, for the driver, the algorithms and the experiments). Execution: `fused`,
`shards`, `lanes` and `resident` (rounds on shards of clients, examples held
on the worker), `scratch` (temporary directories a killed process does not
leave behind), `default_context`, and `tff_private` (the one door to TFF's
private modules). The paper packages (`large_cohort`, `adabest_tff`,
`gel_tff`) import this one, TFF and never each other; reading run
directories, sweeps and figures are the experiments' (`reproduce`).
"""

from fl_common import tf_environment  # Keras 2 for TFF, before TensorFlow  # pylint: disable=unused-import
