"""The accounting app: its testable function and one real run of the module."""

import json
import os
import subprocess
import sys

import pytest

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
