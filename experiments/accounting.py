"""Calibrates a DP-SynRAG run's noise to an (epsilon, delta) budget and prints it as JSON.

  python -m experiments.accounting --epsilon=10 --delta=1e-3                  # paper, closed form
  python -m experiments.accounting --epsilon=10 --delta=1e-3 --accountant=rdp # tighter RDP route

Prints one JSON object: the calibrated parameters, the total rho, and the epsilon that both
accountants give for the calibrated run (the chosen one equals --epsilon).
"""

from __future__ import annotations

import json

from dpsynrag_jax import privacy


def accounting_report(epsilon: float, delta: float, *, K: int = 10, L: int = 5, T: int = 70,
                      tau: float = 1.0, rho_hist: float = 0.1, eps_theta: float = 0.4,
                      rho_retr: float = 0.009, accountant: str = "closed_form") -> dict:
  """The calibration of a run and its epsilon under both accountants, as a JSON-able dict."""
  cal = privacy.calibrate(epsilon, delta, K=K, L=L, T=T, tau=tau, rho_hist=rho_hist,
                          eps_theta=eps_theta, rho_retr=rho_retr, accountant=accountant)
  event = cal.dp_event()
  return {
      "accountant": accountant,
      "epsilon": epsilon,
      "delta": delta,
      "K": K, "L": L, "T": T, "tau": tau,
      "rho_hist": rho_hist,
      "rho_threshold_per_cluster": privacy.exponential_rho(eps_theta),
      "rho_retr_per_cluster": privacy.gaussian_rho(1.0, cal.sigma_mu),
      "rho_tokens_per_cluster": T * cal.per_token_rho,
      "rho_total": cal.rho_total,
      "rho_dp_accounting_rdp": privacy.rdp_rho(event),
      "sigma_h": cal.sigma_h,
      "sigma_mu": cal.sigma_mu,
      "eps_theta": cal.eps_theta,
      "c": cal.c,
      "c_over_tau": cal.c_over_tau,
      "per_token_eps": cal.per_token_eps,
      "per_token_rho": cal.per_token_rho,
      "eps_closed_form": cal.eps_closed_form(),
      "eps_dp_accounting_rdp": privacy.rdp_epsilon(event, delta),
  }


def _define_flags():
  # Defined only when run as a program: importing this module (tests, other apps in one
  # process) must not register flags that another experiment may also define.
  from absl import flags  # pylint: disable=g-import-not-at-top
  flags.DEFINE_float("epsilon", 10.0, "Total epsilon of the run.")
  flags.DEFINE_float("delta", 1e-3, "Total delta of the run.")
  flags.DEFINE_integer("K", 10, "Keywords extracted per document.")
  flags.DEFINE_integer("L", 5, "Most clusters a document can sit in.")
  flags.DEFINE_integer("T", 70, "Tokens generated per cluster.")
  flags.DEFINE_float("tau", 1.0, "Sampling temperature of the private decoding.")
  flags.DEFINE_float("rho_hist", 0.1, "zCDP rho of the keyword histogram.")
  flags.DEFINE_float("eps_theta", 0.4, "epsilon of each cluster's threshold mechanism.")
  flags.DEFINE_float("rho_retr", 0.009, "zCDP rho of each cluster's noisy embedding sum.")
  flags.DEFINE_enum("accountant", "closed_form", ["closed_form", "rdp"],
                    "How the budget is converted: Theorem 1's closed form or dp_accounting RDP.")
  return flags.FLAGS


def main(argv):
  del argv
  from absl import flags  # pylint: disable=g-import-not-at-top
  f = flags.FLAGS
  report = accounting_report(f.epsilon, f.delta, K=f.K, L=f.L, T=f.T, tau=f.tau,
                             rho_hist=f.rho_hist, eps_theta=f.eps_theta, rho_retr=f.rho_retr,
                             accountant=f.accountant)
  print(json.dumps(report, indent=1))


if __name__ == "__main__":
  from absl import app  # pylint: disable=g-import-not-at-top
  _define_flags()
  app.run(main)
