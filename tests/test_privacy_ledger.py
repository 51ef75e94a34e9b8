"""The privacy ledger: totals against Theorem 1, JSON round trip, budget refusal, speed."""

import json
import math
import time

import pytest

from dpsynrag_jax import privacy
from dpsynrag_jax.privacy import ledger as ledger_lib

PAPER = dict(K=10, L=5, T=70, tau=1.0, rho_hist=0.1, eps_theta=0.4, rho_retr=0.009)


def record_run(ledger, cal, clusters):
  """The releases of a run in pipeline order: histogram, then each cluster's three releases."""
  ledger.record_histogram(cal.K, cal.sigma_h)
  for r in range(clusters):
    ledger.record_threshold(r, cal.eps_theta)
    ledger.record_cluster_mean(r, cal.sigma_mu)
    ledger.record_tokens(r, cal.T, cal.c, cal.tau)
  return ledger


@pytest.mark.parametrize("accountant", privacy.ACCOUNTANTS)
def test_full_run_totals_equal_theorem1(accountant):
  cal = privacy.calibrate(10.0, 1e-3, accountant=accountant, **PAPER)
  ledger = record_run(privacy.PrivacyLedger.for_calibration(cal), cal, clusters=40)
  rho = privacy.theorem1_rho(cal.K, cal.sigma_h, cal.L, cal.eps_theta, cal.sigma_mu, cal.T,
                             cal.c, cal.tau)
  assert len(ledger.entries) == 1 + 3 * 40
  assert ledger.rho == pytest.approx(rho, rel=1e-12)
  assert ledger.spent_epsilon("closed_form") == pytest.approx(privacy.zcdp_to_eps(rho, 1e-3),
                                                              rel=1e-12)
  assert ledger.spent_epsilon("rdp") == pytest.approx(
      privacy.rdp_epsilon(cal.dp_event(), 1e-3), rel=1e-9)
  # The run spends its whole budget under its own accountant.
  assert ledger.spent_epsilon() == pytest.approx(10.0, abs=1e-6)
  # The grouped DpEvent of the ledger tells dp_accounting the same story.
  assert privacy.rdp_epsilon(ledger.dp_event(), 1e-3) == pytest.approx(
      ledger.spent_epsilon("rdp"), rel=1e-9)
  assert privacy.rdp_rho(ledger.dp_event()) == pytest.approx(rho, rel=1e-9)


def test_without_parallel_composition_every_cluster_is_charged():
  ledger = privacy.PrivacyLedger(1e6, 1e-3, max_clusters_per_document=None)
  for r in range(7):
    ledger.record_threshold(r, 0.4)
  assert ledger.rho == pytest.approx(7 * 0.4**2 / 8)
  capped = privacy.PrivacyLedger(1e6, 1e-3, max_clusters_per_document=3)
  for r, eps in enumerate([0.1, 0.5, 0.2, 0.4, 0.3]):
    capped.record_threshold(r, eps)
  # The worst document sits in the three most expensive clusters.
  assert capped.rho == pytest.approx((0.5**2 + 0.4**2 + 0.3**2) / 8)
  assert privacy.rdp_rho(capped.dp_event()) == pytest.approx(capped.rho, rel=1e-9)


def test_json_round_trip_and_resume(tmp_path):
  cal = privacy.calibrate(10.0, 1e-3, accountant="rdp", **PAPER)
  ledger = record_run(privacy.PrivacyLedger.for_calibration(cal), cal, clusters=6)
  path = str(tmp_path / "ledger.json")
  ledger.save(path)
  loaded = privacy.PrivacyLedger.load(path)
  assert loaded.entries == ledger.entries
  assert loaded.summary() == ledger.summary()
  assert loaded.to_json() == ledger.to_json()
  data = json.loads(open(path, encoding="utf-8").read())
  assert data["entries"][1] == {"kind": "exponential", "params": {"epsilon": 0.4},
                                "rho": pytest.approx(0.02), "label": "cluster 0 threshold",
                                "cluster": 0}
  # A resumed run keeps its budget: the full cluster 0 cannot take more tokens...
  with pytest.raises(privacy.BudgetExceededError):
    loaded.record_tokens(0, 1, cal.c, cal.tau)
  # ...while a new cluster still fits (parallel composition).
  record_run_cluster = loaded.record_tokens(6, cal.T, cal.c, cal.tau)
  assert record_run_cluster.cluster == 6


def test_load_rejects_edited_rho():
  ledger = privacy.PrivacyLedger(10.0, 1e-3)
  ledger.record_histogram(10, 7.0)
  data = json.loads(ledger.to_json())
  data["entries"][0]["rho"] = 0.001
  with pytest.raises(ValueError, match="corrupt"):
    privacy.PrivacyLedger.from_json(json.dumps(data))
  with pytest.raises(ValueError, match="format"):
    privacy.PrivacyLedger.from_json(json.dumps({**data, "format": "other"}))


@pytest.mark.parametrize("accountant", privacy.ACCOUNTANTS)
def test_refuses_release_over_budget(accountant):
  cal = privacy.calibrate(10.0, 1e-3, accountant=accountant, **PAPER)
  ledger = record_run(privacy.PrivacyLedger.for_calibration(cal), cal, clusters=cal.L + 1)
  before = (ledger.entries, ledger.rho, ledger.spent_epsilon())
  with pytest.raises(privacy.BudgetExceededError, match="budget 10"):
    ledger.record_histogram(cal.K, cal.sigma_h, label="second histogram")
  with pytest.raises(privacy.BudgetExceededError, match="cluster 1 tokens"):
    ledger.record_tokens(1, 1, cal.c, cal.tau)
  # A refused release records nothing.
  assert (ledger.entries, ledger.rho, ledger.spent_epsilon()) == before


def test_rdp_calibrated_run_exceeds_a_closed_form_ledger():
  cal = privacy.calibrate(10.0, 1e-3, accountant="rdp", **PAPER)
  ledger = privacy.PrivacyLedger(10.0, 1e-3, accountant="closed_form",
                                 max_clusters_per_document=cal.L)
  with pytest.raises(privacy.BudgetExceededError):
    record_run(ledger, cal, clusters=cal.L)


def test_entries_take_public_parameters_only():
  with pytest.raises(ValueError, match="exactly the parameters"):
    privacy.make_entry("gaussian", {"sensitivity": 1.0, "sigma": 2.0, "cluster_size": 17})
  with pytest.raises(ValueError, match="Unknown mechanism"):
    privacy.make_entry("laplace", {"scale": 1.0})
  with pytest.raises(ValueError, match="> 0"):
    privacy.make_entry("exponential", {"epsilon": -1.0})
  with pytest.raises(ValueError, match="integer"):
    privacy.make_entry("tokens", {"count": 2.5, "c": 0.1, "tau": 1.0})
  with pytest.raises(ValueError, match="number"):
    privacy.make_entry("exponential", {"epsilon": "0.4"})
  entry = privacy.make_entry("tokens", {"count": 70, "c": 0.1, "tau": 1.0}, cluster=3)
  assert entry.rho == pytest.approx(70 * 0.005)
  # A hand-built entry that under-reports its rho is charged what its parameters cost.
  forged = privacy.Entry(kind="tokens", params={"count": 70, "c": 0.1, "tau": 1.0}, rho=1e-9)
  ledger = privacy.PrivacyLedger(10.0, 1e-3)
  assert ledger.record(forged).rho == pytest.approx(0.35)
  assert ledger.rho == pytest.approx(0.35)


def test_recording_a_paper_scale_run_is_fast():
  cal = privacy.calibrate(10.0, 1e-3, accountant="rdp", **PAPER)
  start = time.perf_counter()
  ledger = record_run(privacy.PrivacyLedger.for_calibration(cal), cal, clusters=500)
  elapsed = time.perf_counter() - start
  assert len(ledger.entries) == 1501
  assert ledger.spent_epsilon() == pytest.approx(10.0, abs=1e-6)
  assert elapsed < 20.0, f"recording 1501 entries took {elapsed:.1f}s"
  start = time.perf_counter()
  loaded = privacy.PrivacyLedger.from_json(ledger.to_json())
  assert loaded.rho == pytest.approx(ledger.rho, rel=1e-12)
  assert time.perf_counter() - start < 20.0
  assert math.isfinite(privacy.rdp_epsilon(loaded.dp_event(), 1e-3))
  assert ledger_lib.FORMAT in loaded.to_json()
