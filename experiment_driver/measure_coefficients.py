"""Prints GeL client updates' gradient coefficients as CSV (Figure 3).

    python -m experiment_driver.measure_coefficients --momentum=0.9 \
        --variants=6:0,18:0,6:12

Each variant `tau_i:tau'` (`tau'` a count or `infinite`) is measured by
`gel_tff.coefficients.measure_gradient_coefficients`; the output has the
columns `gradient_steps`, `guessed_steps`, `k`, `coefficient`. This is how
`python -m reproduce gel fig3` measures the figure: as a subprocess, like
every run it makes, so that its own process imports no algorithm.
"""

import argparse
import sys
from collections.abc import Sequence
from typing import Optional, Union

import tensorflow_federated as tff

from fl_engine import runtime
from gel_tff import client_work
from gel_tff import coefficients


def parse_variants(text: str) -> list[tuple[int, Union[int, str]]]:
  """`'6:0,6:infinite'` -> `[(6, 0), (6, 'infinite')]`.

  Raises:
    ValueError: For a malformed variant.
  """
  variants = []
  for item in text.split(','):
    steps, _, guessed = item.partition(':')
    try:
      variant = (int(steps), guessed if guessed == client_work.INFINITE
                 else int(guessed))
    except ValueError:
      raise ValueError(f'--variants: {item!r} is not tau_i:tau\' (tau\' a'
                       ' count or infinite)') from None
    if variant[0] < 1:
      raise ValueError(f'--variants: tau_i must be >= 1, got {item!r}')
    variants.append(variant)
  return variants


def main(argv: Optional[Sequence[str]] = None) -> int:
  parser = argparse.ArgumentParser(
      prog='python -m experiment_driver.measure_coefficients',
      description=__doc__.split('\n\n')[2].replace('\n', ' '))
  parser.add_argument('--momentum', type=float, required=True)
  parser.add_argument('--variants', required=True,
                      help="Comma-separated tau_i:tau' pairs.")
  args = parser.parse_args(argv)
  runtime.refuse_unmanaged_default_context()
  try:
    variants = parse_variants(args.variants)
    for steps, guessed in variants:
      client_work.validate_client_work_args(
          learning_rate=0.1, momentum=args.momentum, expected_steps=steps,
          guessed_steps=guessed, proximal_strength=0.0,
          client_weighting=tff.learning.ClientWeighting.UNIFORM)
  except ValueError as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  print('gradient_steps,guessed_steps,k,coefficient')
  for steps, guessed in variants:
    measured = coefficients.measure_gradient_coefficients(
        momentum=args.momentum, gradient_steps=steps, guessed_steps=guessed)
    for k, value in enumerate(measured):
      print(f'{steps},{guessed},{k},{value:.9g}')
  return 0


if __name__ == '__main__':
  sys.exit(main())
