"""Bounded-range accounting (privacy/bounded_range.py) against independent computations.

The RDP curve of an eps0-BR mechanism is checked three ways: it bounds the Renyi divergence of
real exponential mechanisms whose utilities one record moves within the range; it is attained by
the worst-case pair (so it is tight, not merely valid); and it is a true sup over t (a dense grid
never exceeds it). The composed delta of identical worst-case pairs is checked against
dp_accounting's privacy loss distributions.
"""

import math

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld_lib

from dpsynrag_jax.privacy import bounded_range

ORDERS = (1.25, 1.5, 2.0, 3.0, 5.0, 8.0, 16.0, 64.0)


def _renyi(log_p, log_q, alpha):
  """D_alpha(P || Q) of two pmfs given as log-probabilities, by the definition."""
  terms = alpha * log_p + (1.0 - alpha) * log_q
  top = terms.max()
  return float((top + np.log(np.sum(np.exp(terms - top)))) / (alpha - 1.0))


def _log_softmax(x):
  z = x - x.max()
  return z - np.log(np.sum(np.exp(z)))


@pytest.mark.parametrize("eps0", [0.05, 0.21, 1.0, 3.0])
def test_curve_is_a_sup_over_t_and_below_zcdp(eps0):
  curve = bounded_range.br_rdp(eps0, ORDERS)
  t = np.linspace(0.0, eps0, 100_001)[1:-1]
  for alpha, value in zip(ORDERS, curve):
    dense = bounded_range._renyi_at(eps0, t, alpha).max()   # pylint: disable=protected-access
    assert dense <= value <= dense * (1 + 1e-6) + 1e-15
    assert value <= alpha * eps0**2 / 8 + 1e-15


def test_exponential_mechanisms_stay_below_the_curve_and_the_worst_pair_reaches_it():
  rng = np.random.default_rng(0)
  c, tau = 0.4, 1.0
  eps0 = 2 * c / tau
  curve = bounded_range.br_rdp(eps0, ORDERS)
  worst = np.zeros(len(ORDERS))
  for _ in range(300):
    vocab = int(rng.integers(2, 50))
    others = rng.normal(size=vocab) * 3                 # the other documents' clipped sums
    mine = rng.uniform(-c, c, size=vocab)               # one document's clipped contribution
    if rng.random() < 0.5:                              # extreme contributions: +-c
      mine = np.where(rng.random(vocab) < rng.random(), c, -c)
    with_doc, without = _log_softmax((others + mine) / tau), _log_softmax(others / tau)
    for j, alpha in enumerate(ORDERS):
      for p, q in ((with_doc, without), (without, with_doc)):   # remove and add
        worst[j] = max(worst[j], _renyi(p, q, alpha))
  assert np.all(worst <= curve)
  # The two-point pair at the maximising t is a valid eps0-BR mechanism reaching the curve.
  for j, alpha in enumerate(ORDERS):
    ts = np.linspace(0, eps0, 20_001)[1:-1]
    t = ts[np.argmax(bounded_range._renyi_at(eps0, ts, alpha))]   # pylint: disable=protected-access
    q, top, bottom = bounded_range.worst_case_pair(eps0, t)
    p_pmf = np.array([q, 1 - q])
    q_pmf = p_pmf * np.exp(-np.array([top, bottom]))
    assert q_pmf.sum() == pytest.approx(1.0, abs=1e-12)
    assert _renyi(np.log(p_pmf), np.log(q_pmf), alpha) == pytest.approx(curve[j], rel=1e-6)


@pytest.mark.parametrize("eps0,k,t_share", [(0.21, 350, 0.5), (0.4, 5, 0.3), (1.0, 20, 0.7)])
def test_nonadaptive_delta_matches_privacy_loss_distributions(eps0, k, t_share):
  t = t_share * eps0
  q, top, bottom = bounded_range.worst_case_pair(eps0, t)
  # dp_accounting's pair (upper, lower): the privacy loss log(upper / lower) under upper.
  upper = {0: math.log(q), 1: math.log1p(-q)}
  lower = {0: math.log(q) - top, 1: math.log1p(-q) - bottom}
  pld = pld_lib.from_two_probability_mass_functions(
      lower, upper, value_discretization_interval=1e-5).self_compose(k)
  for epsilon in (0.5, 1.0, 2.0):
    ours = bounded_range.nonadaptive_delta(eps0, k, epsilon, t)
    theirs = pld.get_delta_for_epsilon(epsilon)
    assert ours == pytest.approx(theirs, rel=2e-3, abs=1e-9)


def test_bad_parameters_are_refused():
  with pytest.raises(ValueError, match="eps0"):
    bounded_range.br_rdp(-1.0, ORDERS)
  with pytest.raises(ValueError, match="orders"):
    bounded_range.br_rdp(0.2, (1.0, 2.0))
  with pytest.raises(ValueError, match="t must be"):
    bounded_range.worst_case_pair(0.2, 0.3)
  assert not bounded_range.br_rdp(0.0, ORDERS).any()


def test_accountant_comparison_orders_the_bounds():
  """At the paper's settings, every valid accounting affords at least Theorem 1's c, the
  bounded-range RDP curves at least the zCDP ones, and none more than the optimal
  non-adaptive composition (which no valid adaptive bound can beat)."""
  from experiments import accounting as accounting_app  # pylint: disable=g-import-not-at-top
  (row,) = accounting_app.compare_accountants([10.0], 1e-3, t_shares=(0.5,))
  c = {k: row[f"c_over_tau_{k}"] for k, _, _ in accounting_app.COMPARED}
  assert c["closed_form"] == pytest.approx(0.10573, abs=1e-5)
  assert c["closed_form"] <= c["azuma"] < c["rdp"] < c["br_rdp"] < c["nonadaptive_optimal"]
  assert "| bounded-range RDP curves" in accounting_app.comparison_markdown([row])


def test_worst_case_kl_is_the_largest_mean_loss():
  for eps0 in (0.05, 0.5, 2.0):
    t = np.linspace(0, eps0, 200_001)[1:-1]
    q = np.expm1(eps0 - t) / (np.expm1(eps0 - t) - np.expm1(-t))
    mean = q * t + (1 - q) * (t - eps0)
    assert bounded_range.worst_case_kl(eps0) == pytest.approx(mean.max(), rel=1e-6)
    assert bounded_range.worst_case_kl(eps0) < eps0**2 / 8
