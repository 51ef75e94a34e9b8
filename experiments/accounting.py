"""Calibrates a DP-SynRAG run's noise to an (epsilon, delta) budget and prints it as JSON.

  python -m experiments.accounting --epsilon=10 --delta=1e-3                  # paper, closed form
  python -m experiments.accounting --epsilon=10 --delta=1e-3 --accountant=rdp # tighter RDP route

  python -m experiments.accounting --compare --epsilons=3,5,10 --out=docs/results/accountants

Prints one JSON object: the calibrated parameters, the total rho, and the epsilon that both
accountants give for the calibrated run (the chosen one equals --epsilon).

--compare: the largest token clipping bound c that each way of accounting affords at each
budget (the same mechanisms, the same (eps, delta)); see `compare_accountants`. Writes
accountants.json and accountants.md under --out when given.
"""

from __future__ import annotations

import json
import math
import os
from typing import Callable, Sequence

from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.rdp import rdp_privacy_accountant
import numpy as np

from dpsynrag_jax import privacy
from dpsynrag_jax.privacy import bounded_range


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


def _largest_c(epsilon_of_c: Callable[[float], float], epsilon: float, lo: float, hi: float,
               tol: float = 1e-7) -> float:
  """The largest c in [lo, hi] with epsilon_of_c(c) <= epsilon (epsilon increasing in c)."""
  if epsilon_of_c(lo) > epsilon:
    raise ValueError(f"Even c = {lo} spends more than epsilon = {epsilon}.")
  while epsilon_of_c(hi) <= epsilon:
    lo, hi = hi, 2 * hi
  while hi - lo > tol:
    mid = (lo + hi) / 2
    lo, hi = (mid, hi) if epsilon_of_c(mid) <= epsilon else (lo, mid)
  return lo


def _nonadaptive_pld(eps0: float, count: int, t_share: float, disc: float):
  """count independent worst-case pairs at t = t_share * eps0, as a dp_accounting PLD."""
  q, top, bottom = bounded_range.worst_case_pair(eps0, t_share * eps0)
  upper = {0: math.log(q), 1: math.log1p(-q)}
  lower = {0: math.log(q) - top, 1: math.log1p(-q) - bottom}
  return pld_lib.from_two_probability_mass_functions(
      lower, upper, value_discretization_interval=disc).self_compose(count)


def compare_accountants(epsilons: Sequence[float], delta: float, *, K: int = 10, L: int = 5,
                        T: int = 70, tau: float = 1.0, rho_hist: float = 0.1,
                        eps_theta: float = 0.4, rho_retr: float = 0.009,
                        t_shares: Sequence[float] = (0.3, 0.4, 0.5, 0.6, 0.7),
                        pld_discretization: float = 1e-3) -> list[dict]:
  """c / tau that each accounting affords for a DP-SynRAG run at each epsilon (Theorem 1's
  mechanisms: the histogram and embedding-sum Gaussians, L threshold EMs of eps_theta and L*T
  token steps, each (2c/tau)-BR).

  closed_form, rdp: the project's two accountants (zCDP events; Theorem 1's conversion or
    dp_accounting's RDP conversion).
  br_rdp: each BR step's own RDP curve (bounded_range.br_rdp) instead of zCDP's
    alpha eps0^2 / 8, through the same RDP conversion. Valid under adaptive composition.
  azuma: Dong, Durfee & Rogers' efficiently computable adaptive bound
    (bounded_range.azuma_epsilon). Valid under adaptive composition.
  nonadaptive_optimal: the optimal composition if every step were chosen in advance with one
    common t (generalized randomized response), max over `t_shares` of t / eps0, by
    dp_accounting's PLDs. NOT valid here: a token step's distribution depends on the tokens
    before it (adaptive), and adaptivity costs more (the same paper). A reference for how much
    any composition theorem could still give.
  """
  sigma_h = math.sqrt(K / (2.0 * rho_hist))
  sigma_mu = math.sqrt(1.0 / (2.0 * rho_retr))
  gaussian_rho = privacy.gaussian_rho(math.sqrt(K), sigma_h) + L * privacy.gaussian_rho(
      1.0, sigma_mu)
  orders = np.asarray(privacy.accounting.DEFAULT_ORDERS, np.float64)
  threshold_curve = bounded_range.br_rdp(eps_theta, orders)

  def br_rdp_eps(c):
    curve = (orders * gaussian_rho + L * threshold_curve +
             L * T * bounded_range.br_rdp(2 * c / tau, orders))
    return float(rdp_privacy_accountant.compute_epsilon(orders, curve, delta)[0])

  def azuma_eps(c):
    return bounded_range.azuma_epsilon([(eps_theta, L), (2 * c / tau, L * T)], gaussian_rho,
                                       delta)

  def nonadaptive_eps(c):
    mu = math.sqrt(2 * gaussian_rho)   # the Gaussians compose into one of rho = mu^2 / 2
    gauss = pld_lib.from_gaussian_mechanism(1.0 / mu, value_discretization_interval=
                                            pld_discretization)
    return max(_nonadaptive_pld(2 * c / tau, L * T, share, pld_discretization)
               .compose(_nonadaptive_pld(eps_theta, L, share, pld_discretization))
               .compose(gauss).get_epsilon_for_delta(delta) for share in t_shares)

  rows = []
  for epsilon in epsilons:
    closed = privacy.calibrate(epsilon, delta, K=K, L=L, T=T, tau=tau, rho_hist=rho_hist,
                               eps_theta=eps_theta, rho_retr=rho_retr).c
    rdp = privacy.calibrate(epsilon, delta, K=K, L=L, T=T, tau=tau, rho_hist=rho_hist,
                            eps_theta=eps_theta, rho_retr=rho_retr, accountant="rdp").c
    found = {"closed_form": closed, "rdp": rdp,
             "br_rdp": _largest_c(br_rdp_eps, epsilon, closed / 2, rdp),
             "azuma": _largest_c(azuma_eps, epsilon, closed / 2, closed),
             "nonadaptive_optimal": _largest_c(nonadaptive_eps, epsilon, closed / 2, rdp,
                                               tol=1e-5)}
    rows.append({"epsilon": epsilon, "delta": delta,
                 **{f"c_over_tau_{k}": v / tau for k, v in found.items()},
                 **{f"gain_{k}": v / closed - 1 for k, v in found.items()}})
  return rows


COMPARED = (("closed_form", "Theorem 1 (zCDP closed form)", "yes"),
            ("rdp", "zCDP events, dp_accounting RDP conversion", "yes"),
            ("br_rdp", "bounded-range RDP curves, same conversion", "yes"),
            ("azuma", "Dong-Durfee-Rogers adaptive bound", "yes"),
            ("nonadaptive_optimal", "optimal non-adaptive composition (reference)", "no"))


def comparison_markdown(rows: Sequence[dict]) -> str:
  eps_cols = " | ".join(f"eps {r['epsilon']:g}" for r in rows)
  lines = [f"| accounting | valid for adaptive token steps | {eps_cols} |",
           "|---|---|" + "---|" * len(rows)]
  for key, name, valid in COMPARED:
    cells = " | ".join(f"{r['c_over_tau_' + key]:.5f} ({100 * r['gain_' + key]:+.1f} %)"
                       for r in rows)
    lines.append(f"| {name} | {valid} | {cells} |")
  return ("c / tau afforded (change against Theorem 1's closed form), delta "
          f"{rows[0]['delta']:g}\n\n" + "\n".join(lines) + "\n")


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
  flags.DEFINE_bool("compare", False, "Compare the c that each accounting affords instead.")
  flags.DEFINE_list("epsilons", ["3", "5", "10"], "Budgets compared with --compare.")
  flags.DEFINE_string("out", "", "With --compare: folder for accountants.json and .md.")
  return flags.FLAGS


def main(argv):
  del argv
  from absl import flags  # pylint: disable=g-import-not-at-top
  f = flags.FLAGS
  if f.compare:
    rows = compare_accountants([float(e) for e in f.epsilons], f.delta, K=f.K, L=f.L, T=f.T,
                               tau=f.tau, rho_hist=f.rho_hist, eps_theta=f.eps_theta,
                               rho_retr=f.rho_retr)
    text = comparison_markdown(rows)
    print(text)
    if f.out:
      os.makedirs(f.out, exist_ok=True)
      with open(os.path.join(f.out, "accountants.json"), "w", encoding="utf-8") as out:
        json.dump(rows, out, indent=1)
      with open(os.path.join(f.out, "accountants.md"), "w", encoding="utf-8") as out:
        out.write(text)
    return
  report = accounting_report(f.epsilon, f.delta, K=f.K, L=f.L, T=f.T, tau=f.tau,
                             rho_hist=f.rho_hist, eps_theta=f.eps_theta, rho_retr=f.rho_retr,
                             accountant=f.accountant)
  print(json.dumps(report, indent=1))


if __name__ == "__main__":
  from absl import app  # pylint: disable=g-import-not-at-top
  _define_flags()
  app.run(main)
