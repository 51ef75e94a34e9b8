"""The accounting app: its testable function and one real run of the module."""

import json
import os
import subprocess
import sys

import pytest

from dpsynrag_jax import privacy
from experiments import accounting as accounting_app

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REQUIRED = ("rho_total", "sigma_h", "sigma_mu", "eps_theta", "c_over_tau", "per_token_eps",
            "eps_closed_form", "eps_dp_accounting_rdp")


def test_report_for_the_paper_settings():
  closed = accounting_app.accounting_report(10.0, 1e-3)
  rdp = accounting_app.accounting_report(10.0, 1e-3, accountant="rdp")
  for report in (closed, rdp):
    assert all(key in report for key in REQUIRED)
    json.dumps(report)  # plain JSON types only
    assert report["rho_dp_accounting_rdp"] == pytest.approx(report["rho_total"], rel=1e-9)
    assert report["per_token_eps"] == pytest.approx(2 * report["c_over_tau"])
  assert closed["c_over_tau"] == pytest.approx(0.106, abs=5e-4)
  # The paper's settings keep their figures (BUILD_NOTES, README): c/tau to 5 digits.
  assert round(closed["c_over_tau"], 5) == 0.10573
  assert round(rdp["c_over_tau"], 5) == 0.11617
  # Theorem 1 part by part: the histogram and L clusters of threshold, sum and T tokens.
  parts = closed["rho_per_cluster"]
  assert parts["threshold"] == pytest.approx(0.4**2 / 8, rel=1e-12)
  assert parts["embedding_sum"] == pytest.approx(0.009, rel=1e-12)
  assert parts["tokens"] == pytest.approx(70 * closed["c_over_tau"]**2 / 2, rel=1e-12)
  assert parts["topic_terms"] == parts["sparse_vector_tests"] == 0.0
  assert closed["rho_total"] == pytest.approx(0.1 + 5 * parts["total"], rel=1e-12)
  assert closed["rho_total"] == pytest.approx(privacy.calibrate(10.0, 1e-3).rho_total,
                                              rel=1e-12)
  assert closed["sigma_mu"] == pytest.approx(7.4536, abs=1e-4)
  assert closed["eps_closed_form"] == pytest.approx(10.0, abs=1e-9)
  assert closed["eps_dp_accounting_rdp"] < 10.0
  assert rdp["eps_dp_accounting_rdp"] == pytest.approx(10.0, abs=1e-6)
  assert rdp["c_over_tau"] > closed["c_over_tau"]


def test_module_prints_one_json_object():
  out = subprocess.run(
      [sys.executable, "-m", "experiments.accounting", "--epsilon=10", "--delta=1e-3",
       "--accountant=rdp", "--T=70", "--L=5", "--K=10"],
      cwd=REPO, capture_output=True, text=True, timeout=120, check=True,
      env={**os.environ, "JAX_PLATFORMS": "cpu"})
  report = json.loads(out.stdout)
  assert report["accountant"] == "rdp"
  assert all(key in report for key in REQUIRED)
  assert report["eps_dp_accounting_rdp"] == pytest.approx(10.0, abs=1e-6)


TERMS = "medical_synth.diseases:1,medical_synth.symptoms:3"


def test_options_beyond_the_paper_are_accounted():
  topics = accounting_app.accounting_report(5.0, 1e-3, L=1, T=32, topic_terms=TERMS,
                                            topic_share=0.5)
  cal = privacy.calibrate(5.0, 1e-3, L=1, T=32, topic_count=4, topic_share=0.5)
  assert topics["topic_count"] == 4 and topics["eps_topic"] == pytest.approx(cal.eps_topic)
  assert topics["rho_per_cluster"]["topic_terms"] == pytest.approx(4 * cal.eps_topic**2 / 8)
  assert topics["eps_closed_form"] == pytest.approx(5.0, abs=1e-9)
  svt = accounting_app.accounting_report(5.0, 1e-3, svt_paid=20, svt_share=0.3,
                                         accountant="rdp")
  assert svt["paid_tokens_per_cluster"] == 20
  assert svt["rho_per_cluster"]["sparse_vector_tests"] == pytest.approx(
      0.3 / 0.7 * svt["rho_per_cluster"]["tokens"], rel=1e-12)
  assert svt["eps_dp_accounting_rdp"] == pytest.approx(5.0, abs=1e-6)
  openings = accounting_app.accounting_report(5.0, 1e-3, T=0, topic_terms=TERMS,
                                              topic_share=1.0, accountant="rdp")
  assert openings["c"] == 0.0 and openings["rho_per_cluster"]["tokens"] == 0.0
  assert openings["eps_dp_accounting_rdp"] == pytest.approx(5.0, abs=1e-6)


def test_a_config_is_charged_as_its_build_charges():
  from experiments.configs import medical_synth  # pylint: disable=g-import-not-at-top
  config = medical_synth.get_config("demo")
  report = accounting_app.config_report(config)
  assert report == accounting_app.accounting_report(
      5.0, 1e-3, L=5, T=0, topic_terms=config.generation.topic_terms, topic_share=1.0,
      accountant="rdp")
  assert report["eps_dp_accounting_rdp"] == pytest.approx(5.0, abs=1e-6)
  # Without re-ranking no threshold or embedding sum is charged: the budget is not all spent.
  config = medical_synth.get_config("tiny")
  config.clustering.rerank = False
  report = accounting_app.config_report(config)
  assert report["rho_per_cluster"]["threshold"] == report["rho_per_cluster"]["embedding_sum"] == 0
  assert report["eps_closed_form"] < config.privacy.epsilon
  # Fewer clusters than L: a document sits in at most R of them.
  config = medical_synth.get_config("tiny")
  config.clustering.R = 1
  report = accounting_app.config_report(config)
  assert report["clusters_charged"] == 1
  assert report["rho_total"] == pytest.approx(0.1 + report["rho_per_cluster"]["total"])


@pytest.mark.parametrize("settings, message", [
    (dict(T=0), "needs generation.topic_terms"),
    (dict(T=0, topic_terms=TERMS), "set topic_share=1"),
    (dict(topic_terms=TERMS, topic_share=1.0), "openings-only"),
    (dict(topic_terms="medical_synth.nothing:1"), "Unknown Medical Synth term list"),
    (dict(topic_terms="medical_synth.diseases:x"), "counts >= 1"),
    (dict(svt_paid=71), "svt_paid must be in 0 .. T"),
    (dict(svt_paid=10, svt_share=1.0), "svt_share must be in"),
    (dict(epsilon=0.5), "alone cost rho"),
])
def test_settings_the_build_refuses_are_refused(settings, message):
  settings = {"epsilon": 10.0, **settings}
  with pytest.raises(ValueError, match=message):
    accounting_app.accounting_report(settings.pop("epsilon"), 1e-3, **settings)


@pytest.mark.parametrize("args, message", [
    (["--T=0", f"--topic_terms={TERMS}"], "set topic_share=1"),
    (["--config=experiments/configs/medical_synth.py:tiny", "--epsilon=3"],
     "--epsilon beside --config"),
    (["--compare", "--svt_paid=4"], "paper's mechanisms only"),
])
def test_module_refuses_with_the_reason(args, message):
  out = subprocess.run([sys.executable, "-m", "experiments.accounting", *args], cwd=REPO,
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert out.returncode != 0 and not out.stdout
  assert message in out.stderr
