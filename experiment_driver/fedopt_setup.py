"""Flags-to-process for FedOpt and FedSGD (SPEC.md §1)."""

from experiment_driver import algorithm_setup
from large_cohort import fedopt


def _build_fedopt(
    ctx: algorithm_setup.BuildContext) -> algorithm_setup.AlgorithmSetup:
  return algorithm_setup.AlgorithmSetup(process=fedopt.build_fedopt(
      ctx.task.model_fn,
      client_optimizer=ctx.client_optimizer,
      server_optimizer=ctx.server_optimizer,
      uniform_weighting=ctx.uniform_weighting,
      model_aggregator=ctx.model_aggregator,
  ))


def _build_fedsgd(
    ctx: algorithm_setup.BuildContext) -> algorithm_setup.AlgorithmSetup:
  if ctx.uniform_weighting:
    raise ValueError('--algorithm=fedsgd averages gradients by example count;'
                     ' --uniform_weighting is not supported with it')
  return algorithm_setup.AlgorithmSetup(process=fedopt.build_fedsgd(
      ctx.task.model_fn,
      server_optimizer=ctx.server_optimizer,
      model_aggregator=ctx.model_aggregator,
  ))


ALGORITHMS = {'fedopt': _build_fedopt, 'fedsgd': _build_fedsgd}
