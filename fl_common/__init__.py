"""What the three papers' packages share: aggregators and measurements.

`aggregator_wrappers` (wrapping TFF aggregation factories), `diagnostics` and
`diagnosed_mean` (the large-cohort paper's update norm, pairwise cosine and
discarded-update counts, with adaptive clipping, around any family's mean),
`per_client_evaluation` (evaluation with per-client accuracy percentiles),
`communication` (bytes exchanged per round, read off TFF types), `fused`,
`shards` and `resident` (rounds on shards of clients, examples held on the
worker), `scratch` (temporary directories that a killed process does not
leave behind), and the reading of run directories (`analysis`) and the
papers' figures drawn from them (`plots`, `python -m fl_common.plots`). The
paper packages import this one, TFF and `tasks`, never each other.
"""

from fl_common import tf_environment  # Keras 2 for TFF, before TensorFlow  # pylint: disable=unused-import
