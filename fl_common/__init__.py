"""What the three papers' packages share: aggregators and measurements.

`aggregator_wrappers` (wrapping TFF aggregation factories), `diagnostics` and
`diagnosed_mean` (the large-cohort paper's update norm, pairwise cosine and
discarded-update counts, with adaptive clipping, around any family's mean),
`per_client_evaluation` (evaluation with per-client accuracy percentiles) and
`communication` (bytes exchanged per round, read off TFF types). The paper
packages import this one, TFF and `tasks`, never each other.
"""
