"""Runs a stateful-client process round by round, owning the client states.

A `StatefulClientLearningProcess`'s `next` takes each client's data *and* its
stored state, and returns the new states. `StatefulClientRunner` keeps those
states in a `ClientStateStore` (a parameter: any directory, or a temporary
one) so that a round is one call from client ids and datasets, in a notebook
as in the driver's training loop:

    runner = StatefulClientRunner(adabest.build_adabest(model_fn))
    state = runner.initialize()
    for round_num in range(1, 11):
      state, metrics = runner.next(state, client_ids, client_datasets)
"""

import weakref
from collections.abc import Sequence
from typing import Any, Optional

import tensorflow as tf
import tensorflow_federated as tff

from fl_engine import client_state_store
from fl_engine import stateful_process
from fl_engine import scratch


class StatefulClientRunner:
  """A stateful process and the store of its clients' states."""

  def __init__(self,
               process: stateful_process.StatefulClientLearningProcess,
               store: Optional[client_state_store.ClientStateStore] = None):
    """Creates the runner.

    Args:
      process: The stateful learning process (AdaBest, FedDyn, SCAFFOLD).
      store: Where the client states live between rounds; `None`: a store in
        a new temporary directory, removed with the runner.

    Raises:
      TypeError: If `process` keeps no client states.
    """
    if not isinstance(process, stateful_process.StatefulClientLearningProcess):
      raise TypeError('StatefulClientRunner needs a StatefulClientLearningProcess'
                      f', got {type(process).__name__}; run a stateless'
                      ' process with process.next(state, datasets).')
    if store is None:
      # Removed with the runner, at exit, or after a kill by the next one
      # made (`fl_engine.scratch`).
      directory = scratch.OwnedDirectory('client_states_')
      weakref.finalize(self, directory.remove)
      store = client_state_store.ClientStateStore(
          directory.path, process.initial_client_state())
    self.process = process
    self.store = store
    self._last_round = store.committed_round
    self._last_state = None  # the server state the last `next` returned

  def initialize(self) -> Any:
    """The process's initial server state."""
    return self.process.initialize()

  def next(self, state: Any, client_ids: Sequence[str],
           client_datasets: Sequence[tf.data.Dataset],
           round_num: Optional[int] = None
           ) -> tff.learning.templates.LearningProcessOutput:
    """One round: loads the cohort's states, trains, saves the new states.

    Args:
      state: The server state before the round.
      client_ids: The cohort; a client never seen starts from the process's
        `initial_client_state`.
      client_datasets: One dataset per client, in the order of `client_ids`.
      round_num: The 1-based round number the states are saved as; default:
        one after the last round this runner ran. Given, the caller vouches
        that `state` and the store are as of the round before (a resume
        after `store.restore`, as the driver's training loop does).

    Returns:
      `LearningProcessOutput(state, metrics)`, as a stateless process's
      `next` returns.

    Raises:
      ValueError: If `round_num` is not given, this runner ran a round
        before and `state` is not the server state that round returned (a
        notebook cell re-run with an older state): the stored client states
        are that round's, and training the older server state on them would
        silently mix rounds.
    """
    if (round_num is None and self._last_state is not None and
        state is not self._last_state):
      raise ValueError(
          f'this server state is not the one round {self._last_round}'
          f' returned, and the client states are as of round'
          f' {self._last_round}: pass the state round {self._last_round}'
          ' returned, or make a new StatefulClientRunner to start over')
    round_num = self._last_round + 1 if round_num is None else round_num
    output = stateful_process.run_round(self.process, state, client_ids,
                                        client_datasets, self.store,
                                        round_num)
    self._last_round = round_num
    self._last_state = output.state
    return output
