"""AdaBest, FedDyn and SCAFFOLD (Varno et al. 2022) for the driver.

`ALGORITHMS` maps `adabest`, `feddyn` and `scaffold` to builders of
`adabest_tff` processes. All three are `StatefulClientLearningProcess`es: the
training loop runs them with `fl_engine.stateful_process.run_round` and a
`ClientStateStore` in the run directory, committed with each checkpoint.
How a round's clients run (on shards of clients, each shard's client states
stacked, unless `--clients_per_shard=1`) is the driver's
(`algorithm_setup.realize`).
`round_metrics_fn` reports the round's bytes up and down, one client's read
off the process's TFF types (`fl_common.communication`).

Defaults are the paper's (Section 4.1, Appendix D.1): client SGD at 0.1 when
`--client_learning_rate` is unset, decayed by `--client_lr_decay` = 0.998 per
round; `μ = 0.02`; `β = 0.96`; SCAFFOLD's global step `--server_learning_rate`
= 1. Clients always run SGD (the client-side corrections are SGD steps) and
the server update is each paper's own, so the optimizer flags,
`--uniform_weighting` (see `--adabest_client_weighting`), `--clipping`,
`--zeroing` and the server learning-rate scaling are refused with these
algorithms (`SHARED_FLAGS`). The mean is
`fl_common.diagnosed_mean`'s without clipping (TFF's mean with the
paper's diagnostics, in one pass), so these runs report `update_norm`,
`mean_pairwise_cosine` and the discarded-update counts like the other
families (the values aggregated are unchanged). Batch size 45 and
5 local epochs are `--train_batch_size=45 --client_epochs=5`.
"""

from collections.abc import Callable, Mapping
from typing import Any

from absl import flags
import tensorflow_federated as tff

from adabest_tff import adabest
from fl_common import communication
from adabest_tff import feddyn
from adabest_tff import scaffold
from experiment_driver import algorithm_setup
from fl_common import diagnosed_mean

DEFAULT_CLIENT_LEARNING_RATE = 0.1
DEFAULT_SCAFFOLD_SERVER_LEARNING_RATE = 1.0

MU = flags.DEFINE_float(
    'adabest_mu', 0.02,
    'AdaBest and FedDyn: mu, the weight of a round\'s pseudo-gradient in the'
    ' client estimate h_i (FedDyn\'s alpha).', lower_bound=0.0)
BETA = flags.DEFINE_float(
    'adabest_beta', 0.96,
    'AdaBest: beta in [0, 1], the server scale of h^t = beta (xbar^{t-1} -'
    ' xbar^t); the paper picks 0.96 at 10% participation, 0.98 at 100%,'
    ' and searches {0.2, 0.4, 0.6} at 1%.', lower_bound=0.0, upper_bound=1.0)
BETA_DECAY_PATIENCE = flags.DEFINE_integer(
    'adabest_beta_decay_patience', 0,
    'AdaBest: multiply beta by --adabest_beta_decay_factor when ||h^t|| has'
    ' not reached a new minimum for this many rounds (a plateau); 0 never'
    ' decays beta.', lower_bound=0)
BETA_DECAY_FACTOR = flags.DEFINE_float(
    'adabest_beta_decay_factor', 0.5,
    'AdaBest: the factor in (0, 1) applied to beta at a plateau of ||h^t||.',
    lower_bound=0.0, upper_bound=1.0)
CLIENT_LR_DECAY = flags.DEFINE_float(
    'client_lr_decay', 0.998,
    'AdaBest, FedDyn, SCAFFOLD: per-round factor of the client learning rate'
    ' (round t uses client_learning_rate * client_lr_decay^(t-1)).',
    lower_bound=0.0, upper_bound=1.0)
CLIENT_WEIGHTING = flags.DEFINE_enum(
    'adabest_client_weighting', 'uniform', ['uniform', 'num_examples'],
    'AdaBest, FedDyn, SCAFFOLD: "uniform" averages the client models plainly'
    ' and (AdaBest, FedDyn) scales mu by n_mean / n_i with n_mean the running'
    ' mean of examples per client, as the paper handles unbalanced data;'
    ' "num_examples" weights the mean by examples and leaves mu unscaled.')

_LOCAL_TRAINING = frozenset({
    'client_learning_rate', 'train_batch_size', 'client_epochs'})
SHARED_FLAGS = {
    'adabest': _LOCAL_TRAINING,
    'feddyn': _LOCAL_TRAINING,
    # SCAFFOLD's global step size eta_g.
    'scaffold': _LOCAL_TRAINING | {'server_learning_rate'},
}
WHY_NOT = {
    name: (f'{name} fixes its client SGD and server update as its paper'
           ' does, and weights clients by --adabest_client_weighting')
    for name in SHARED_FLAGS}
OWN_FLAGS = {
    'adabest_mu': frozenset({'adabest', 'feddyn'}),
    'adabest_beta': frozenset({'adabest'}),
    'adabest_beta_decay_patience': frozenset({'adabest'}),
    'adabest_beta_decay_factor': frozenset({'adabest'}),
    'client_lr_decay': frozenset(SHARED_FLAGS),
    'adabest_client_weighting': frozenset(SHARED_FLAGS),
}

_CLIENT_WEIGHTING = {
    'uniform': tff.learning.ClientWeighting.UNIFORM,
    'num_examples': tff.learning.ClientWeighting.NUM_EXAMPLES,
}


def unused_own_flags(algorithm: str, values: Mapping[str, Any]
                     ) -> dict[str, str]:
  """Own flags that the other flags' values make moot."""
  why_not = {}
  if algorithm == 'adabest' and not values['adabest_beta_decay_patience']:
    why_not['adabest_beta_decay_factor'] = (
        'needs --adabest_beta_decay_patience > 0 (beta never decays)')
  return why_not


def effective_hparams(algorithm: str, values: Mapping[str, Any]
                      ) -> dict[str, Any]:
  """The learning rates in use: the flags, else the paper's."""
  rates = {'client_learning_rate': (
      DEFAULT_CLIENT_LEARNING_RATE if values['client_learning_rate'] is None
      else values['client_learning_rate'])}
  if algorithm == 'scaffold':
    rates['server_learning_rate'] = (
        DEFAULT_SCAFFOLD_SERVER_LEARNING_RATE
        if values['server_learning_rate'] is None
        else values['server_learning_rate'])
  return rates


def _bytes_metrics(
    process: tff.learning.templates.LearningProcess
) -> algorithm_setup.RoundMetricsFn:
  """The round's bytes up and down: one client's
  (`fl_common.communication.communication_cost`, read off the process's TFF
  types when first needed) times the cohort's size."""
  costs = []

  def round_metrics(round_num, client_ids, metrics):
    del round_num, metrics  # The cost depends on the cohort size only.
    if not costs:
      costs.append(communication.communication_cost(process))
    cost = costs[0]
    return {
        'bytes_down': float(len(client_ids) * cost.bytes_down),
        'bytes_up': float(len(client_ids) * cost.bytes_up),
    }

  return round_metrics


def _build_setup(
    ctx: algorithm_setup.BuildContext,
    build_process: Callable[..., tff.learning.templates.LearningProcess],
    **algorithm_args: Any,
) -> algorithm_setup.ToBuild:
  """`build_process` with the flags the three algorithms share (the
  plain diagnosed mean, which shards compute), and its bytes per round."""
  return algorithm_setup.ToBuild(
      build_process, dict(
          client_learning_rate=ctx.client_learning_rate,
          client_learning_rate_decay=CLIENT_LR_DECAY.value,
          client_weighting=_CLIENT_WEIGHTING[CLIENT_WEIGHTING.value],
          model_aggregator=diagnosed_mean.diagnosed_mean_factory(
              clipping=False),
          **algorithm_args),
      round_metrics_fn_of=_bytes_metrics)


def _build_adabest(
    ctx: algorithm_setup.BuildContext) -> algorithm_setup.ToBuild:
  return _build_setup(
      ctx, adabest.build_adabest,
      mu=MU.value,
      beta=BETA.value,
      beta_decay_patience=BETA_DECAY_PATIENCE.value or None,
      beta_decay_factor=BETA_DECAY_FACTOR.value,
  )


def _build_feddyn(
    ctx: algorithm_setup.BuildContext) -> algorithm_setup.ToBuild:
  return _build_setup(
      ctx, feddyn.build_feddyn,
      population_size=ctx.num_train_clients,
      mu=MU.value,
  )


def _build_scaffold(
    ctx: algorithm_setup.BuildContext) -> algorithm_setup.ToBuild:
  return _build_setup(
      ctx, scaffold.build_scaffold,
      population_size=ctx.num_train_clients,
      server_learning_rate=ctx.server_learning_rate,
  )


ALGORITHMS = {
    'adabest': _build_adabest,
    'feddyn': _build_feddyn,
    'scaffold': _build_scaffold,
}


FAMILY = algorithm_setup.Family(
    algorithms=ALGORITHMS, shared_flags=SHARED_FLAGS, why_not=WHY_NOT,
    own_flags=OWN_FLAGS, unused_own_flags=unused_own_flags,
    effective_hparams=effective_hparams)
