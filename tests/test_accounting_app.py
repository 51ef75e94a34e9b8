"""The accounting app against real tiny builds: for topic terms, the sparse vector test,
openings-only texts (T = 0) and discovered topic terms, its report equals the released privacy ledger's totals (both
accountants) and each cluster's parts, through its function, its --config and its flags."""

import json
import os
import subprocess
import sys

import pytest

from dpsynrag_jax import privacy
from dpsynrag_jax.synrag import pipeline
from dpsynrag_jax.synrag import workdir as wd_lib
from experiments import accounting as accounting_app
from experiments.configs import medical_synth

pytestmark = pytest.mark.slow   # builds end to end

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TERMS = "medical_synth.diseases:1,medical_synth.symptoms:2"
TOL = 1e-9


def tiny_config(overrides: dict):
  config = medical_synth.get_config("tiny")
  config.clustering.R = 3   # still more clusters than L = 2; half the tiny build's decoding
  for dotted, value in overrides.items():
    section, field = dotted.split(".")
    config[section][field] = value
  return config


def plain_settings(config) -> dict:
  """accounting_report's keyword arguments for `config` (what the plain flags would say)."""
  p, g = config.privacy, config.generation
  return dict(K=config.keywords.K, L=config.clustering.L, T=g.T, tau=g.tau,
              rho_hist=p.rho_hist, eps_theta=p.eps_theta, rho_retr=p.rho_retr,
              accountant=p.accountant, svt_paid=g.svt_paid, svt_share=g.svt_share,
              topic_terms=g.topic_terms, topic_share=p.topic_share)


def run_app(*args) -> dict:
  out = subprocess.run([sys.executable, "-m", "experiments.accounting", *args], cwd=REPO,
                       capture_output=True, text=True, timeout=180, check=True,
                       env={**os.environ, "JAX_PLATFORMS": "cpu"})
  return json.loads(out.stdout)


def assert_report_is_the_ledger(report: dict, ledger: privacy.PrivacyLedger, config) -> None:
  assert report["rho_total"] == pytest.approx(ledger.rho, abs=TOL)
  assert report["rho_dp_accounting_rdp"] == pytest.approx(ledger.rho, abs=TOL)
  assert report["eps_closed_form"] == pytest.approx(ledger.spent_epsilon("closed_form"),
                                                    abs=TOL)
  assert report["eps_dp_accounting_rdp"] == pytest.approx(ledger.spent_epsilon("rdp"),
                                                          abs=TOL)
  # The chosen accountant's epsilon is the budget, in the report as in the ledger.
  chosen = {"closed_form": "eps_closed_form", "rdp": "eps_dp_accounting_rdp"}
  assert report[chosen[config.privacy.accountant]] == pytest.approx(config.privacy.epsilon,
                                                                    abs=1e-6)
  # Part by part: the histogram, and every released cluster's threshold, embedding sum,
  # topic terms, tokens and tests.
  assert report["rho_histogram"] == pytest.approx(
      sum(e.rho for e in ledger.entries if e.cluster is None and e.kind == "gaussian"), abs=TOL)
  assert report["rho_terms"] == pytest.approx(
      sum(e.rho for e in ledger.entries if e.kind == "partition_selection"), abs=TOL)
  assert report["delta_terms"] == pytest.approx(ledger.delta_spent, rel=1e-12, abs=0.0)
  clusters = sorted({e.cluster for e in ledger.entries if e.cluster is not None})
  assert clusters == list(range(config.clustering.R))
  assert report["clusters_charged"] == min(config.clustering.R, config.clustering.L)
  for r in clusters:
    assert accounting_app.cluster_parts(ledger, r) == pytest.approx(
        report["rho_per_cluster"], abs=TOL)


def assert_same_report(got: dict, want: dict) -> None:
  """Equal keys; numbers within TOL, nested parts likewise, the rest exactly."""
  assert sorted(got) == sorted(want)
  for key, value in want.items():
    if isinstance(value, dict):
      assert_same_report(got[key], value)
    elif isinstance(value, float):
      assert got[key] == pytest.approx(value, abs=TOL), key
    else:
      assert got[key] == value, key


def build_and_compare(tmp_path, overrides: dict) -> dict:
  config = tiny_config(overrides)
  pipeline.build_synthetic_db(config, str(tmp_path))
  ledger = privacy.PrivacyLedger.load(str(tmp_path / wd_lib.LEDGER))
  from_config = accounting_app.config_report(config)
  from_settings = accounting_app.accounting_report(
      config.privacy.epsilon, config.privacy.delta, **plain_settings(config))
  assert_report_is_the_ledger(from_config, ledger, config)
  # The plain settings know no R and charge L clusters: here R = 3 > L = 2.
  assert_report_is_the_ledger(from_settings, ledger, config)
  assert_same_report(from_settings, from_config)
  return from_config


def test_topic_terms_their_share_and_the_rdp_accountant(tmp_path):
  report = build_and_compare(tmp_path, {"generation.topic_terms": TERMS,
                                        "privacy.topic_share": 0.3,
                                        "privacy.accountant": "rdp"})
  assert report["topic_count"] == 3 and report["eps_topic"] > 0
  assert report["rho_per_cluster"]["topic_terms"] > 0
  assert report["rho_per_cluster"]["sparse_vector_tests"] == 0
  cli = run_app("--config=experiments/configs/medical_synth.py:tiny", "--config.clustering.R=3",
                f"--config.generation.topic_terms={TERMS}", "--config.privacy.topic_share=0.3",
                "--config.privacy.accountant=rdp")
  assert_same_report(cli, report)


def test_the_sparse_vector_test(tmp_path):
  report = build_and_compare(tmp_path, {"generation.svt_paid": 4, "generation.svt_share": 0.3})
  assert report["paid_tokens_per_cluster"] == 4 and report["epsilon_test"] > 0
  assert report["rho_per_cluster"]["sparse_vector_tests"] == pytest.approx(
      0.3 / 0.7 * report["rho_per_cluster"]["tokens"], rel=1e-12)
  cli = run_app("--K=10", "--L=2", "--T=8", "--svt_paid=4", "--svt_share=0.3")
  assert_same_report(cli, report)


def test_openings_only_texts_with_topic_terms_taking_everything(tmp_path):
  report = build_and_compare(tmp_path, {"generation.T": 0, "generation.topic_terms": TERMS,
                                        "privacy.topic_share": 1.0})
  assert report["c"] == 0.0 and report["paid_tokens_per_cluster"] == 0
  assert report["rho_per_cluster"]["tokens"] == 0.0
  cli = run_app("--K=10", "--L=2", "--T=0", f"--topic_terms={TERMS}", "--topic_share=1")
  assert_same_report(cli, report)


def test_discovered_terms_their_partition_selection_and_delta(tmp_path):
  overrides = {"generation.T": 0, "generation.topic_terms": "discovered:3",
               "privacy.topic_share": 1.0, "privacy.rho_terms": 1.0,
               "privacy.accountant": "rdp"}
  config = tiny_config(overrides)
  pipeline.build_synthetic_db(config, str(tmp_path))
  ledger = privacy.PrivacyLedger.load(str(tmp_path / wd_lib.LEDGER))
  report = accounting_app.config_report(config)
  assert_report_is_the_ledger(report, ledger, config)
  # One partition selection: rho 1, delta the configured share of delta, spent by both
  # accountants before converting the rest.
  assert report["rho_terms"] == pytest.approx(1.0, rel=1e-12)
  assert ledger.delta_spent == pytest.approx(0.1 * config.privacy.delta, rel=1e-9)
  assert ledger.spent_epsilon("rdp") == pytest.approx(config.privacy.epsilon, abs=1e-6)
  cli = run_app("--config=experiments/configs/medical_synth.py:tiny", "--config.clustering.R=3",
                "--config.generation.T=0", "--config.generation.topic_terms=discovered:3",
                "--config.privacy.topic_share=1", "--config.privacy.rho_terms=1",
                "--config.privacy.accountant=rdp")
  assert_same_report(cli, report)
