"""Straggler runtime model (Charles et al. 2021, appendix B.5).

A probabilistic straggler model after Lee et al. (2017): client `k` with `N_k`
examples needs time

```
X_k = α·N_k + E_k,   E_k ~ Exp(mean λ·N_k)
```

(the paper writes `X_k − α·N_k ~ Exp(1/(λ·N_k))`, the rate parametrization;
its mean is `λ·N_k`), and a round of synchronous FedOpt lasts as long as its
slowest client, `Y_t = max_{k ∈ C_t} X_k`. `λ = 0` is the deterministic
`X_k = α·N_k`. Only client compute is modelled (no server or communication
time). The paper uses α = 1 and λ ∈ {0.1, 1, 10, 100} and reports
time-to-accuracy relative to M = 10.
"""

from collections.abc import Sequence

import numpy as np


def simulated_round_time(num_examples_per_client: Sequence[int],
                         alpha: float,
                         lam: float,
                         rng: np.random.Generator) -> float:
  """Samples the duration of one round, `max_k α·N_k + Exp(mean λ·N_k)`.

  Args:
    num_examples_per_client: `N_k` for each client of the cohort (>= 0).
    alpha: α >= 0, time per example.
    lam: λ >= 0, the straggler parameter (mean extra time per example).
    rng: The numpy generator drawing the exponentials (one per client, in
      cohort order), e.g. `np.random.default_rng(seed)`.

  Returns:
    The round time `Y_t`.

  Raises:
    ValueError: For an empty cohort, a negative count, alpha or lam.
  """
  counts = np.asarray(num_examples_per_client, dtype=np.float64)
  if counts.ndim != 1 or counts.size == 0:
    raise ValueError(
        'num_examples_per_client must be a non-empty list of counts, got '
        f'{num_examples_per_client!r}.')
  if np.any(counts < 0):
    raise ValueError(
        f'example counts must be >= 0, got {num_examples_per_client!r}.')
  if alpha < 0.0:
    raise ValueError(f'alpha must be >= 0, got {alpha}.')
  if lam < 0.0:
    raise ValueError(f'lam must be >= 0, got {lam}.')
  client_times = alpha * counts + rng.exponential(scale=lam * counts)
  return float(np.max(client_times))
