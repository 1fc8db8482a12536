"""The counted arithmetic of the AdaBest family against Algorithm 2's lines."""

import pytest
import tensorflow as tf

from adabest_tff import cost

SHAPES = [(50, 30), (30,), (30, 20), (20,)]  # n = 2,150


def test_count_arithmetic_counts_elements_and_leaves_out_the_inputs():
  def make_inputs():
    a, b = tf.zeros([4, 5]), tf.zeros([4, 5])
    return a * 3.0, b  # a product the phase does not make: not counted

  additions, multiplications = cost.count_arithmetic(
      make_inputs, lambda a, b: tf.add_n([a, b, a]) - a * b / 2.0)
  # add_n of 3: 2 additions; one subtraction; one product, one quotient.
  assert (additions, multiplications) == (3 * 20, 2 * 20)


def test_count_arithmetic_refuses_an_unknown_shape():
  with pytest.raises(ValueError, match='no static shape'):
    cost.count_arithmetic(
        lambda: (tf.compat.v1.placeholder(tf.float32, [None]),),
        lambda a: a + 1.0)


@pytest.fixture(scope='module')
def counted():
  rows = cost.count_costs(SHAPES)
  assert {r['parameters'] for r in rows} == {2150}
  return {(r['algorithm'], r['phase']): r['additions'] + r['multiplications']
          for r in rows}


@pytest.mark.parametrize('algorithm, per_step', [
    ('fedavg', 0),  # the SGD step alone (ns + nm, common to all)
    ('adabest', 1),  # ∇L − h_i: ns
    ('scaffold', 2),  # ∇L − c_i + c: 2ns
    ('feddyn', 4),  # ∇L − h_i − μ(x − θ): 3ns + nm
])
def test_local_step_costs_the_paper_s_correction(counted, algorithm,
                                                  per_step):
  # Supplementary Algorithm 2's comments on the local loop's line.
  assert counted[(algorithm, 'local_step')] == pytest.approx(2 + per_step)


@pytest.mark.parametrize('algorithm, flops', [
    ('fedavg', 0),
    ('adabest', 3),  # h_i/(t − t'_i) + μ·g_i: ns + 2nm
    ('feddyn', 2),  # h_i + μ·g_i: ns + nm
    ('scaffold', 4),  # c_i − c + Δ/(Kη), and c_i⁺ − c_i sent: 3ns + nm
])
def test_client_conclusion_counts(counted, algorithm, flops):
  assert counted[(algorithm, 'client_conclusion')] == pytest.approx(
      flops, abs=0.01)  # scalar arithmetic: O(1), not O(n)


@pytest.mark.parametrize('algorithm, flops', [
    ('fedavg', 2),  # x − 1·ḡ (TFF's SGD)
    ('adabest', 4),  # β(h + ḡ), x − ḡ − h
    ('feddyn', 4),  # h + (|P|/|S|)·ḡ, x − ḡ − h
    ('scaffold', 4),  # x − η_g·ḡ, c + Σ/|S|
])
def test_server_update_counts(counted, algorithm, flops):
  assert counted[(algorithm, 'server_update')] == pytest.approx(
      flops, abs=0.01)
