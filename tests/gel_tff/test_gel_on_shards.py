"""gel_tff's fused processes: a round on shards of clients equals the
per-client round (`build_gel` / `build_budgeted_baseline` with the same
diagnosed mean) for every row of Table 3, with and without guessing, its
clients one after the other or side by side (`lanes`): model,
clipping norm, server optimizer state, FedNova's effective steps, the
gradient count, diagnostics and training metrics, with step budgets,
uneven client sizes, an empty client, a NaN client and uneven shards."""

import functools

import numpy as np
import pytest
import tensorflow_federated as tff

from fl_common import diagnosed_mean
from gel_tff import budgets
from gel_tff import gel
from fl_common import normalized_update
from tests import fused_checks
from tests import tiny_models

_NUM_FEATURES = fused_checks.NUM_FEATURES


def _round_datasets(round_num):
  # Uneven sizes, a short last batch, an empty client and a NaN one; each
  # cut to its budget of batches (cycling), as the driver does.
  sizes = [5, 1, 0, 8, 3, 4, 2]
  steps = budgets.StepBudgets(2, 6, seed=3).draw(round_num, len(sizes))
  return [budgets.limit_to_steps(d, s) for d, s in zip(
      fused_checks.client_datasets(sizes, nan_client=4, seed=round_num),
      steps)], steps


def _builder_kwargs(base, use_gel):
  kwargs = dict(base=base, client_learning_rate=0.05,
                model_aggregator=diagnosed_mean.diagnosed_mean_factory(
                    clipping=True, initial_clipping_norm=0.05))
  if base == 'fedyogi':
    kwargs['server_optimizer'] = gel.build_server_optimizer(base, 0.1)
  if use_gel:
    kwargs['expected_steps'] = 6
  return kwargs


@functools.cache
def _per_client(base, use_gel):
  """The per-client process, built once for the lanes it is compared with."""
  build = gel.build_gel if use_gel else gel.build_budgeted_baseline
  return build(tiny_models.linear_model_fn(_NUM_FEATURES),
               **_builder_kwargs(base, use_gel))


@pytest.mark.parametrize('base', gel.BASES)
@pytest.mark.parametrize('use_gel, lanes', [(True, 1), (False, 1),
                                            (True, 3), (False, 2)])
def test_a_fused_round_equals_the_per_client_round(base, use_gel, lanes):
  model_fn = tiny_models.linear_model_fn(_NUM_FEATURES)
  kwargs = _builder_kwargs(base, use_gel)
  per_client = _per_client(base, use_gel)
  if use_gel:
    on_shards = fused_checks.on_shards(gel.build_gel, model_fn, lanes=lanes, **kwargs)
  else:
    on_shards = fused_checks.on_shards(gel.build_budgeted_baseline, model_fn, lanes=lanes,
                                                  **kwargs)
  assert (on_shards.initialize.type_signature ==
          per_client.initialize.type_signature)
  state = fused_state = per_client.initialize()
  for round_num, clients_per_shard in ((0, 3), (1, 4)):
    datasets, steps = _round_datasets(round_num)
    output, fused_output = fused_checks.assert_same_round(
        per_client, on_shards, state, fused_state, datasets, clients_per_shard)
    state, fused_state = output.state, fused_output.state
  client_work = fused_output.metrics['client_work']
  # Every budgeted step of the non-empty clients was a gradient computation.
  assert client_work['gradient_steps'] == sum(
      s for k, s in enumerate(steps) if k != 2)
  assert not np.allclose(
      per_client.get_model_weights(state).trainable[0],
      per_client.get_model_weights(per_client.initialize()).trainable[0])


@pytest.mark.parametrize('base', ['fedavgcm', 'fednova'])
def test_the_normalized_update_is_fused_too(base):
  # FedNova normalizes its inner mean, then scales it by tau_eff.
  model_fn = tiny_models.linear_model_fn(fused_checks.NUM_FEATURES)
  kwargs = dict(base=base, expected_steps=6,
                model_aggregator=normalized_update.normalized_update_factory(
                    diagnosed_mean.diagnosed_mean_factory(clipping=False)))
  per_client = gel.build_gel(model_fn, **kwargs)
  on_shards = fused_checks.on_shards(gel.build_gel, model_fn, **kwargs)
  state = per_client.initialize()
  datasets, _ = _round_datasets(0)
  output, fused_output = fused_checks.assert_same_round(
      per_client, on_shards, state, state, datasets, 3)


def test_uniform_weighting_with_the_unweighted_mean():
  model_fn = tiny_models.linear_model_fn(_NUM_FEATURES)
  uniform = tff.learning.ClientWeighting.UNIFORM
  unweighted = diagnosed_mean.diagnosed_mean_factory(weighted=False)
  per_client = gel.build_gel(
      model_fn, client_weighting=uniform, expected_steps=6,
      model_aggregator=tff.aggregators.as_weighted_aggregator(unweighted))
  on_shards = fused_checks.on_shards(gel.build_gel, model_fn, client_weighting=uniform,
                                  expected_steps=6,
                                  model_aggregator=unweighted)
  state = per_client.initialize()
  datasets, _ = _round_datasets(0)
  output, fused_output = fused_checks.assert_same_round(
      per_client, on_shards, state, state, datasets, 2)


def test_refuses_what_it_cannot_fuse():
  model_fn = tiny_models.linear_model_fn(_NUM_FEATURES)
  with pytest.raises(TypeError, match='DiagnosedMeanFactory'):
    fused_checks.on_shards(gel.build_gel, model_fn,
                        model_aggregator=tff.aggregators.MeanFactory())
  with pytest.raises(ValueError, match='momentum'):
    fused_checks.on_shards(gel.build_gel, model_fn, momentum=0.0)
