"""Flags-to-process for FedOpt and FedSGD (SPEC.md §1).

FedOpt (FedAvg, FedAvgM, FedAdagrad, FedAdam, FedYogi, FedLARS, FedLamb by
`--server_optimizer`) honours every optimizer, aggregator and server
learning-rate scaling flag. FedSGD takes one full-batch gradient per client
(client rate 1), so it has no client optimizer, batch size, epochs or uniform
weighting. Unset learning rates take the large-cohort paper's tuned rates
(`experiment_driver.tuned_defaults`).
"""

from collections.abc import Mapping
from typing import Any

from experiment_driver import algorithm_setup
from experiment_driver import flag_groups as f
from experiment_driver import tuned_defaults
from large_cohort import fedopt

_SERVER_SIDE = (f.SERVER_OPTIMIZER_FLAGS | f.SERVER_LR_SCALING_FLAGS |
                f.AGGREGATOR_FLAGS)
SHARED_FLAGS = {
    'fedopt': (_SERVER_SIDE | f.CLIENT_OPTIMIZER_FLAGS |
               {'uniform_weighting', 'train_batch_size', 'client_epochs'}),
    'fedsgd': _SERVER_SIDE,
}
WHY_NOT = {
    'fedopt': 'FedOpt',
    'fedsgd': ('FedSGD takes one full-batch gradient per client, the mean'
               ' over all its examples, at client rate 1'),
}
OWN_FLAGS = {}


def unused_own_flags(algorithm: str, values: Mapping[str, Any]
                     ) -> dict[str, str]:
  """Own flags that the other flags' values make moot: none."""
  del algorithm, values
  return {}


def effective_hparams(algorithm: str, values: Mapping[str, Any]
                      ) -> dict[str, Any]:
  """The learning rates in use: the flags, else the tuned table's.

  Raises:
    tuned_defaults.MissingTunedRateError: If a rate is unset and none is
      tuned for the task and server optimizer.
  """
  names = (('server_learning_rate', 'client_learning_rate')
           if algorithm == 'fedopt' else ('server_learning_rate',))
  rates = {name: values[name] for name in names}
  if None in rates.values():  # Only then is the table needed.
    tuned = tuned_defaults.learning_rates(
        values['task'], values['server_optimizer'],
        fedsgd=algorithm == 'fedsgd')
    rates = {name: tuned[i] if rate is None else rate
             for i, (name, rate) in enumerate(rates.items())}
  return rates


def _build_fedopt(
    ctx: algorithm_setup.BuildContext) -> algorithm_setup.ToBuild:
  return algorithm_setup.ToBuild(fedopt.build_fedopt, dict(
      client_optimizer=ctx.client_optimizer,
      server_optimizer=ctx.server_optimizer,
      client_weighting=ctx.client_weighting,
      model_aggregator=ctx.model_aggregator))


def _build_fedsgd(
    ctx: algorithm_setup.BuildContext) -> algorithm_setup.ToBuild:
  return algorithm_setup.ToBuild(fedopt.build_fedsgd, dict(
      server_optimizer=ctx.server_optimizer,
      model_aggregator=ctx.model_aggregator))


ALGORITHMS = {'fedopt': _build_fedopt, 'fedsgd': _build_fedsgd}


FAMILY = algorithm_setup.Family(
    algorithms=ALGORITHMS, shared_flags=SHARED_FLAGS, why_not=WHY_NOT,
    own_flags=OWN_FLAGS, unused_own_flags=unused_own_flags,
    effective_hparams=effective_hparams)
