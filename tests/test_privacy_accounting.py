"""Theorem 1, the zCDP <-> (eps, delta) conversions, dp_accounting events and calibration."""

import math

import dp_accounting
import numpy as np
import pytest

from dpsynrag_jax import privacy
from dpsynrag_jax.privacy import accounting

PAPER = dict(K=10, L=5, T=70, tau=1.0, rho_hist=0.1, eps_theta=0.4, rho_retr=0.009)


@pytest.mark.parametrize("delta", [1e-3, 1e-6, 1e-9])
@pytest.mark.parametrize("eps", [0.05, 1.0, 10.0, 100.0])
def test_conversions_are_inverse(eps, delta):
  rho = privacy.eps_to_zcdp(eps, delta)
  assert privacy.zcdp_to_eps(rho, delta) == pytest.approx(eps, rel=1e-12)
  # Bun & Steinke's conversion by hand.
  assert privacy.zcdp_to_eps(rho, delta) == pytest.approx(
      rho + 2 * math.sqrt(rho * math.log(1 / delta)), rel=1e-12)


def test_conversions_reject_bad_inputs():
  with pytest.raises(ValueError):
    privacy.zcdp_to_eps(-1.0, 1e-3)
  with pytest.raises(ValueError):
    privacy.eps_to_zcdp(1.0, 0.0)
  with pytest.raises(ValueError):
    privacy.eps_to_zcdp(1.0, 1.5)


def test_theorem1_by_hand():
  rho = privacy.theorem1_rho(K=10, sigma_h=2.0, L=3, eps_theta=0.5, sigma_mu=4.0, T=7, c=0.2,
                             tau=2.0)
  by_hand = 10 / 8 + 3 * (0.25 / 8 + 1 / 32 + 7 / 2 * 0.01)
  assert rho == pytest.approx(by_hand, rel=1e-14)


SETTINGS = [
    dict(K=10, sigma_h=7.07, L=5, eps_theta=0.4, sigma_mu=7.45, T=70, c=0.106, tau=1.0),
    dict(K=1, sigma_h=1.0, L=1, eps_theta=1.0, sigma_mu=1.0, T=1, c=1.0, tau=1.0),
    dict(K=20, sigma_h=30.0, L=10, eps_theta=0.1, sigma_mu=50.0, T=200, c=0.01, tau=0.5),
    dict(K=5, sigma_h=0.8, L=2, eps_theta=3.0, sigma_mu=0.5, T=10, c=2.0, tau=1.0),
    dict(K=3, sigma_h=100.0, L=1, eps_theta=0.01, sigma_mu=300.0, T=5, c=0.001, tau=1.0),
]


@pytest.mark.parametrize("setting", SETTINGS)
def test_dp_event_matches_theorem1(setting):
  event = privacy.run_dp_event(**setting)
  rho = privacy.theorem1_rho(**setting)
  # The RDP curve of a zCDP run is rho * alpha at every order: read rho off it.
  assert abs(privacy.rdp_rho(event) - rho) <= 1e-9 * max(1.0, rho)
  for delta in (1e-3, 1e-5, 1e-8):
    assert privacy.rdp_epsilon(event, delta) <= privacy.zcdp_to_eps(rho, delta) + 1e-12


def test_dp_event_structure():
  event = privacy.run_dp_event(**SETTINGS[0])
  assert isinstance(event, dp_accounting.ComposedDpEvent)
  hist, clusters = event.events
  assert hist.noise_multiplier == pytest.approx(7.07 / math.sqrt(10))
  assert clusters.count == 5
  threshold, mean, tokens = clusters.event.events
  assert threshold.rho == pytest.approx(0.4**2 / 8)
  assert mean.noise_multiplier == 7.45
  assert tokens.count == 70 and tokens.event.rho == pytest.approx(0.106**2 / 2)


def test_rho_from_rdp_rejects_non_zcdp_curves():
  orders = np.array([2.0, 4.0, 8.0])
  with pytest.raises(ValueError, match="not plain zCDP"):
    accounting.rho_from_rdp(orders, np.array([1.0, 1.5, 2.0]))


def test_closed_form_calibration_reproduces_paper():
  cal = privacy.calibrate(10.0, 1e-3, accountant="closed_form", **PAPER)
  assert cal.sigma_h == pytest.approx(math.sqrt(50.0))
  assert cal.sigma_mu == pytest.approx(7.4536, abs=1e-4)
  assert cal.eps_theta == 0.4
  assert cal.c_over_tau == pytest.approx(0.106, abs=5e-4)
  assert cal.per_token_eps == pytest.approx(2 * cal.c_over_tau)
  assert cal.per_token_rho == pytest.approx(cal.c_over_tau**2 / 2)
  assert cal.rho_total == pytest.approx(privacy.eps_to_zcdp(10.0, 1e-3), rel=1e-12)


BUDGETS = [(10.0, 1e-3), (1.0, 1e-5), (4.0, 1e-6), (30.0, 1e-3)]


@pytest.mark.parametrize("accountant", privacy.ACCOUNTANTS)
@pytest.mark.parametrize("epsilon,delta", BUDGETS)
def test_calibration_round_trip(accountant, epsilon, delta):
  settings = dict(PAPER)
  if epsilon < 2:  # the paper's fixed parts alone cost more than eps = 1
    settings.update(rho_hist=0.01, eps_theta=0.05, rho_retr=0.001)
  cal = privacy.calibrate(epsilon, delta, accountant=accountant, **settings)
  if accountant == "closed_form":
    recomputed = privacy.zcdp_to_eps(
        privacy.theorem1_rho(cal.K, cal.sigma_h, cal.L, cal.eps_theta, cal.sigma_mu, cal.T,
                             cal.c, cal.tau), delta)
  else:
    recomputed = privacy.rdp_epsilon(
        privacy.run_dp_event(cal.K, cal.sigma_h, cal.L, cal.eps_theta, cal.sigma_mu, cal.T,
                             cal.c, cal.tau), delta)
  assert abs(recomputed - epsilon) <= 1e-6
  # Calibration never overspends under its own accountant.
  assert recomputed <= epsilon + 1e-9


def test_rdp_calibration_affords_larger_c():
  closed = privacy.calibrate(10.0, 1e-3, accountant="closed_form", **PAPER)
  rdp = privacy.calibrate(10.0, 1e-3, accountant="rdp", **PAPER)
  assert (rdp.sigma_h, rdp.sigma_mu, rdp.eps_theta) == (closed.sigma_h, closed.sigma_mu,
                                                        closed.eps_theta)
  ratio = rdp.c / closed.c
  # Measured 1.0988 with dp_accounting 0.6.0's default orders.
  assert 1.05 < ratio < 1.15
  # The closed form overstates the rdp run's epsilon, the RDP accountant does not.
  assert rdp.eps_closed_form() > 10.0
  assert closed.eps_rdp() < 10.0


def test_calibration_scales_c_with_tau():
  one = privacy.calibrate(10.0, 1e-3, **PAPER)
  two = privacy.calibrate(10.0, 1e-3, **{**PAPER, "tau": 2.0})
  assert two.c == pytest.approx(2 * one.c) and two.c_over_tau == pytest.approx(one.c_over_tau)


def test_calibration_refuses_budget_the_fixed_parts_exceed():
  with pytest.raises(ValueError, match="alone cost"):
    privacy.calibrate(0.5, 1e-3, **PAPER)
  with pytest.raises(ValueError, match="accountant"):
    privacy.calibrate(10.0, 1e-3, accountant="moments", **{k: v for k, v in PAPER.items()})


@pytest.mark.parametrize("accountant", ["closed_form", "rdp"])
def test_baseline_calibrations_spend_exactly_their_budget(accountant):
  """DP-Synth and DP-RAG take c from the calibration helpers, under either accountant, and
  their ledgers (the same cost functions) read back exactly the budget."""
  c = privacy.calibrate_dp_synth(10.0, 1e-3, T=70, accountant=accountant)
  ledger = privacy.PrivacyLedger(10.0, 1e-3, accountant=accountant, max_clusters_per_document=1)
  for b in range(5):
    ledger.record_tokens(b, 70, c, 1.0)
  assert ledger.spent_epsilon() == pytest.approx(10.0, rel=1e-6)
  eps_r, c = privacy.calibrate_dp_rag(30.0, 1e-3, num_queries=3, T=30, accountant=accountant)
  ledger = privacy.PrivacyLedger(30.0, 1e-3, accountant=accountant)
  for q in range(3):
    ledger.record(privacy.make_entry("exponential", {"epsilon": eps_r}, label=f"q{q}"))
    ledger.record_tokens(None, 30, c, 1.0, label=f"q{q} tokens")
  assert ledger.spent_epsilon() == pytest.approx(30.0, rel=1e-6)
  closed = privacy.calibrate_dp_synth(10.0, 1e-3, T=70)
  assert closed == pytest.approx(math.sqrt(2 * privacy.eps_to_zcdp(10.0, 1e-3) / 70))
  if accountant == "rdp":
    assert privacy.calibrate_dp_synth(10.0, 1e-3, T=70, accountant="rdp") > closed


def test_every_cost_comes_from_one_table():
  """The ledger's rho and DpEvents, Theorem 1 and the mechanisms' helpers agree because they
  are the same functions (privacy.costs)."""
  from dpsynrag_jax.privacy import costs, ledger as ledger_lib
  assert ledger_lib._KINDS is costs.KINDS
  cal = privacy.calibrate(10.0, 1e-3)
  parts = [privacy.make_entry("gaussian", {"sensitivity": math.sqrt(cal.K), "sigma": cal.sigma_h}),
           privacy.make_entry("exponential", {"epsilon": cal.eps_theta}),
           privacy.make_entry("gaussian", {"sensitivity": 1.0, "sigma": cal.sigma_mu}),
           privacy.make_entry("tokens", {"count": cal.T, "c": cal.c, "tau": cal.tau})]
  rho = parts[0].rho + cal.L * sum(p.rho for p in parts[1:])
  assert rho == pytest.approx(cal.rho_total, rel=1e-12)
  assert privacy.token_rho(cal.c, cal.tau) == costs.tokens_rho(1, cal.c, cal.tau)
  assert privacy.gaussian_rho(1.0, cal.sigma_mu) == costs.gaussian_rho(1.0, cal.sigma_mu)
