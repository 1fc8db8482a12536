"""Per-round client step budgets of GeL's experiments (Boukhari et al. 2024).

Section 4.1 ("Client budgets"): every round, each selected client draws its
computational budget `tau_i ~ U{a, ..., b}` (both ends included) and can take
only `tau_i` local steps that round; the server asks for `tau = b + 5` steps.

Budgets are a property of the data a client trains on, not of the learning
process: the process stays stateless and simply trains on every batch it is
given. This module draws the budgets with a NumPy generator seeded by
`(seed, round_num)` (so a run is reproducible and a resumed run draws the same
budgets) and cuts each client's batched dataset to exactly `tau_i` batches,
repeating it when the client has fewer (local training counts steps, not
epochs).
"""

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff


@dataclasses.dataclass(frozen=True)
class StepBudgets:
  """Uniform integer budgets `tau_i ~ U{budget_min, ..., budget_max}`.

  Attributes:
    budget_min: The smallest budget `a` (at least 1).
    budget_max: The largest budget `b` (at least `budget_min`).
    seed: The run's seed; round `t` uses the generator seeded by `(seed, t)`.
  """

  budget_min: int
  budget_max: int
  seed: int = 0

  def __post_init__(self):
    if self.budget_min < 1:
      raise ValueError(
          f'budget_min must be at least 1, got {self.budget_min}.')
    if self.budget_max < self.budget_min:
      raise ValueError(
          f'budget_max ({self.budget_max}) must be at least budget_min'
          f' ({self.budget_min}).')
    if self.seed < 0:
      raise ValueError(f'seed must be nonnegative, got {self.seed}.')

  def draw(self, round_num: int, num_clients: int) -> list[int]:
    """Returns the budgets of the `num_clients` clients sampled in a round.

    Args:
      round_num: The round number; the same round always gets the same
        budgets.
      num_clients: How many clients were sampled (one budget each, in order).
    """
    if round_num < 0:
      raise ValueError(f'round_num must be nonnegative, got {round_num}.')
    generator = np.random.default_rng([self.seed, round_num])
    return generator.integers(
        self.budget_min, self.budget_max, endpoint=True, size=num_clients
    ).tolist()


def limit_to_steps(batched_dataset: tf.data.Dataset,
                   steps: int) -> tf.data.Dataset:
  """Returns exactly `steps` batches of `batched_dataset`, cycling through it.

  An empty dataset stays empty (the client then takes no step).
  """
  if steps < 0:
    raise ValueError(f'steps must be nonnegative, got {steps}.')
  return batched_dataset.repeat().take(steps)


def build_client_datasets_fn(
    client_data: tff.simulation.datasets.ClientData,
    preprocess_fn: Callable[[tf.data.Dataset], tf.data.Dataset],
    budgets: StepBudgets,
) -> Callable[[int, Sequence[str]], list[tf.data.Dataset]]:
  """Builds the driver's `client_datasets_fn(round_num, client_ids)` hook.

  Args:
    client_data: The training clients' data.
    preprocess_fn: The task's training preprocessing (it must batch); its
      epoch count does not matter since the batches are repeated.
    budgets: The budget distribution; client `k` of the sampled list gets the
      `k`-th budget of `budgets.draw(round_num, len(client_ids))`.

  Returns:
    A function returning, for a round's sampled clients, each client's
    preprocessed dataset cut to its budget of batches.
  """

  def client_datasets_fn(round_num: int,
                         client_ids: Sequence[str]) -> list[tf.data.Dataset]:
    steps = budgets.draw(round_num, len(client_ids))
    return [
        limit_to_steps(
            preprocess_fn(client_data.create_tf_dataset_for_client(client_id)),
            client_steps,
        )
        for client_id, client_steps in zip(client_ids, steps)
    ]

  return client_datasets_fn
