"""Calibrates a DP-SynRAG run's noise to an (epsilon, delta) budget and prints it as JSON.

  python -m experiments.accounting --epsilon=10 --delta=1e-3                  # paper, closed form
  python -m experiments.accounting --epsilon=10 --delta=1e-3 --accountant=rdp # tighter RDP route

  # topic terms (generation.topic_terms, privacy.topic_share)
  python -m experiments.accounting --L=1 --T=32 \
      --topic_terms=medical_synth.diseases:1,medical_synth.symptoms:3 --topic_share=0.5
  # openings-only texts: T = 0, the topic terms take everything left (topic_share = 1)
  python -m experiments.accounting --T=0 --topic_terms=medical_synth.diseases:1 --topic_share=1
  # the sparse vector test (generation.svt_paid, svt_share)
  python -m experiments.accounting --svt_paid=20 --svt_share=0.3

  # a build config, exactly as experiments.build_synthetic_db would calibrate and charge it
  python -m experiments.accounting --config=experiments/configs/medical_synth.py:demo \
      --config.privacy.epsilon=3 --config.privacy.accountant=rdp

  python -m experiments.accounting --compare --epsilons=3,5,10 --out=docs/results/accountants

Prints one JSON object: the calibrated parameters; per cluster, each part of its zCDP rho
(threshold, embedding sum, topic terms, tokens, sparse vector tests); the histogram's rho; and
the totals (rho, and epsilon under Theorem 1's closed form and dp_accounting's RDP accountant;
the chosen accountant's equals --epsilon). The totals are read off a privacy ledger holding the
entries a build records (`planned_ledger`), so they equal the released privacy_ledger.json's.
The calibration is `pipeline.calibration_of`, the build's own, for the plain flags too (they
are turned into the fields of a config that it reads). Settings the build refuses are refused
here with the build's message. generation.svt_threshold (in documents, public) costs nothing
and is not a flag.

--config: every accounting setting comes from the config (override fields as
--config.FIELD=VALUE); the plain settings flags are refused beside it. A config with R < L
clusters charges R of them (clustering.merge_synonyms can leave fewer clusters than R, which
only spends less), and clustering.rerank=False charges no threshold or embedding sum (the
budget calibrated for them stays unspent, as in the build).

--compare: the largest token clipping bound c that each way of accounting affords at each
budget (the same mechanisms, the same (eps, delta)); see `compare_accountants`. Writes
accountants.json and accountants.md under --out when given. The paper's mechanisms only: no
topic terms, sparse vector test or T = 0.
"""

from __future__ import annotations

import json
import math
import os
from typing import Callable, Sequence

from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.rdp import rdp_privacy_accountant
import ml_collections
import numpy as np

from dpsynrag_jax import privacy
from dpsynrag_jax.privacy import bounded_range
from experiments import cli

# Per-cluster parts of rho: (report name, ledger entry kind).
CLUSTER_PARTS = (("threshold", "exponential"), ("embedding_sum", "gaussian"),
                 ("topic_terms", "topic_terms"), ("tokens", "tokens"),
                 ("sparse_vector_tests", "sparse_vector"))


def planned_ledger(cal: privacy.Calibration, *, clusters: int | None = None,
                   rerank: bool = True) -> privacy.PrivacyLedger:
  """The ledger a build calibrated by `cal` records, for its min(clusters, L) most expensive
  clusters (every cluster costs the same; the ledger charges a document the L largest).

  The entries a build records (synrag.clustering, synrag.reranking, synrag.pipeline): the
  histogram; the term discovery's partition selection (terms_m > 0); per cluster its embedding sum and threshold (with re-ranking), its topic terms
  (topic_count > 0), its paid tokens (paid_tokens > 0) and their tests (svt_paid > 0).
  clusters: the build's cluster count when known (clustering.R), else L.
  """
  ledger = privacy.PrivacyLedger.for_calibration(cal)
  ledger.record_histogram(cal.K, cal.sigma_h)
  if cal.terms_m:
    ledger.record_partition_selection(cal.terms_m, cal.sigma_terms, cal.terms_threshold)
  for r in range(cal.L if clusters is None else min(int(clusters), cal.L)):
    if rerank:
      ledger.record_cluster_mean(r, cal.sigma_mu)
      ledger.record_threshold(r, cal.eps_theta)
    if cal.topic_count:
      ledger.record_topic_terms(r, cal.topic_count, cal.eps_topic)
    if cal.paid_tokens:
      ledger.record_tokens(r, cal.paid_tokens, cal.c, cal.tau)
      if cal.svt_paid:
        ledger.record_sparse_vector(r, cal.svt_paid, cal.epsilon_test)
  return ledger


def cluster_parts(ledger: privacy.PrivacyLedger, cluster: int = 0) -> dict:
  """rho of each part of one cluster's releases in `ledger` (CLUSTER_PARTS), and their total."""
  entries = [e for e in ledger.entries if e.cluster == cluster]
  parts = {name: sum((e.rho for e in entries if e.kind == kind), 0.0)
           for name, kind in CLUSTER_PARTS}
  return {**parts, "total": sum(parts.values(), 0.0)}


def config_report(config: ml_collections.ConfigDict) -> dict:
  """The accounting of a build config, as a JSON-able dict: its calibration (the build's own,
  `pipeline.calibration_of`), each part of a cluster's rho and the totals, as its ledger
  records them. Raises ValueError for settings the build refuses."""
  from dpsynrag_jax.synrag import pipeline  # pylint: disable=g-import-not-at-top
  cal = pipeline.calibration_of(config)
  rerank = bool(config.clustering.get("rerank", True))
  ledger = planned_ledger(cal, clusters=config.clustering.get("R", None), rerank=rerank)
  per_cluster = cluster_parts(ledger)
  event = ledger.dp_event()
  return {
      "accountant": cal.accountant,
      "epsilon": cal.epsilon,
      "delta": cal.delta,
      "K": cal.K, "L": cal.L, "T": cal.T, "tau": cal.tau,
      "rho_hist": config.privacy.rho_hist,
      "topic_terms": config.generation.get("topic_terms", ""),
      "topic_count": cal.topic_count,
      "topic_share": config.privacy.get("topic_share", 0.5) if cal.topic_count else 0.0,
      "eps_topic": cal.eps_topic,
      "svt_paid": cal.svt_paid,
      "svt_share": cal.svt_share,
      "epsilon_test": cal.epsilon_test if cal.svt_paid else 0.0,
      "paid_tokens_per_cluster": cal.paid_tokens,
      "rerank": rerank,
      "clusters_charged": len({e.cluster for e in ledger.entries if e.cluster is not None}),
      "rho_histogram": sum((e.rho for e in ledger.entries if e.kind == "gaussian" and
                            e.cluster is None), 0.0),
      "terms_per_document": cal.terms_m,
      "rho_terms": sum((e.rho for e in ledger.entries if e.kind == "partition_selection"), 0.0),
      "sigma_terms": cal.sigma_terms,
      "terms_threshold": cal.terms_threshold,
      "delta_terms": ledger.delta_spent,
      "rho_per_cluster": per_cluster,
      "rho_threshold_per_cluster": per_cluster["threshold"],
      "rho_retr_per_cluster": per_cluster["embedding_sum"],
      "rho_topic_terms_per_cluster": per_cluster["topic_terms"],
      "rho_tokens_per_cluster": per_cluster["tokens"],
      "rho_sparse_vector_per_cluster": per_cluster["sparse_vector_tests"],
      "rho_total": ledger.rho,
      "rho_dp_accounting_rdp": privacy.rdp_rho(event),
      "sigma_h": cal.sigma_h,
      "sigma_mu": cal.sigma_mu,
      "eps_theta": cal.eps_theta,
      "c": cal.c,
      "c_over_tau": cal.c_over_tau,
      "per_token_eps": cal.per_token_eps,
      "per_token_rho": cal.per_token_rho,
      "eps_closed_form": ledger.spent_epsilon("closed_form"),
      "eps_dp_accounting_rdp": ledger.spent_epsilon("rdp"),
  }


def settings_config(epsilon: float, delta: float, *, K: int = 10, L: int = 5, T: int = 70,
                    tau: float = 1.0, rho_hist: float = 0.1, eps_theta: float = 0.4,
                    rho_retr: float = 0.009, accountant: str = "closed_form",
                    svt_paid: int = 0, svt_share: float = 0.5, topic_terms: str = "",
                    topic_share: float = 0.5) -> ml_collections.ConfigDict:
  """The fields of a build config that its accounting reads, from plain settings (the
  defaults are the paper's, and the build config's for the options beyond it)."""
  return ml_collections.ConfigDict({
      "privacy": {"epsilon": float(epsilon), "delta": float(delta),
                  "rho_hist": float(rho_hist), "eps_theta": float(eps_theta),
                  "rho_retr": float(rho_retr), "accountant": accountant,
                  "topic_share": float(topic_share)},
      "keywords": {"K": K},
      "clustering": {"L": L},
      "generation": {"T": T, "tau": float(tau), "svt_paid": svt_paid,
                     "svt_share": float(svt_share), "topic_terms": topic_terms},
  })


def accounting_report(epsilon: float, delta: float, *, K: int = 10, L: int = 5, T: int = 70,
                      tau: float = 1.0, rho_hist: float = 0.1, eps_theta: float = 0.4,
                      rho_retr: float = 0.009, accountant: str = "closed_form",
                      svt_paid: int = 0, svt_share: float = 0.5, topic_terms: str = "",
                      topic_share: float = 0.5) -> dict:
  """The calibration of a run and its epsilon under both accountants, as a JSON-able dict
  (`config_report` of `settings_config`).

  topic_terms: generation.topic_terms ('list:count,...'; '' none), with topic_share
    (privacy.topic_share; 1 with T = 0, openings-only texts).
  svt_paid, svt_share: the sparse vector test (generation.svt_paid, svt_share; 0: off).
  Raises ValueError for settings the build refuses.
  """
  return config_report(settings_config(
      epsilon, delta, K=K, L=L, T=T, tau=tau, rho_hist=rho_hist, eps_theta=eps_theta,
      rho_retr=rho_retr, accountant=accountant, svt_paid=svt_paid, svt_share=svt_share,
      topic_terms=topic_terms, topic_share=topic_share))


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


# The plain settings flags: accounting_report's keyword arguments, and the config field each is.
SETTINGS = ("epsilon", "delta", "K", "L", "T", "tau", "rho_hist", "eps_theta", "rho_retr",
            "accountant", "svt_paid", "svt_share", "topic_terms", "topic_share")


def _define_flags():
  # Defined only when run as a program: importing this module (tests, other apps in one
  # process) must not register flags that another experiment may also define.
  from absl import flags  # pylint: disable=g-import-not-at-top
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  config_flags.DEFINE_config_file(
      "config", None, "A build config (e.g. experiments/configs/medical_synth.py:demo): "
      "account it as the build would, instead of the plain settings flags.", lock_config=True)
  flags.DEFINE_float("epsilon", 10.0, "Total epsilon of the run.")
  flags.DEFINE_float("delta", 1e-3, "Total delta of the run.")
  flags.DEFINE_integer("K", 10, "Keywords extracted per document.")
  flags.DEFINE_integer("L", 5, "Most clusters a document can sit in.")
  flags.DEFINE_integer("T", 70, "Tokens generated per cluster; 0: openings-only texts (topic "
                       "terms alone, with --topic_share=1).")
  flags.DEFINE_float("tau", 1.0, "Sampling temperature of the private decoding.")
  flags.DEFINE_float("rho_hist", 0.1, "zCDP rho of the keyword histogram.")
  flags.DEFINE_float("eps_theta", 0.4, "epsilon of each cluster's threshold mechanism.")
  flags.DEFINE_float("rho_retr", 0.009, "zCDP rho of each cluster's noisy embedding sum.")
  flags.DEFINE_enum("accountant", "closed_form", ["closed_form", "rdp"],
                    "How the budget is converted: Theorem 1's closed form or dp_accounting RDP.")
  flags.DEFINE_integer("svt_paid", 0, "The sparse vector test: at most this many paid tokens "
                       "per text (generation.svt_paid); 0: off.")
  flags.DEFINE_float("svt_share", 0.5, "Part of a paid token's rho that goes to its test "
                     "(generation.svt_share).")
  flags.DEFINE_string("topic_terms", "", "Topic terms per cluster, 'list:count,...' "
                      "(generation.topic_terms); empty: none.")
  flags.DEFINE_float("topic_share", 0.5, "Part of a cluster's rho left after its threshold and "
                     "embedding sum that its topic terms take (privacy.topic_share).")
  flags.DEFINE_bool("compare", False, "Compare the c that each accounting affords instead.")
  flags.DEFINE_list("epsilons", ["3", "5", "10"], "Budgets compared with --compare.")
  flags.DEFINE_string("out", "", "With --compare: folder for accountants.json and .md.")
  return flags.FLAGS


def main(argv):
  from absl import app  # pylint: disable=g-import-not-at-top
  from absl import flags  # pylint: disable=g-import-not-at-top
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  f = flags.FLAGS
  if f.compare:
    if f.config is not None:
      raise app.UsageError("--compare takes the plain settings flags, not --config.")
    if f.svt_paid or f.topic_terms or f.T == 0:
      raise app.UsageError("--compare covers the paper's mechanisms only: drop --svt_paid, "
                           "--topic_terms and --T=0.")
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
  try:
    if f.config is not None:
      given = [f"--{name}" for name in SETTINGS if f[name].present]
      if given:
        raise app.UsageError(f"{', '.join(given)} beside --config: the config holds every "
                             "setting; override its fields instead, e.g. "
                             "--config.privacy.epsilon=3.")
      report = config_report(f.config)
    else:
      report = accounting_report(**{name: f[name].value for name in SETTINGS})
  except ValueError as e:   # what the build would refuse, with the build's message
    raise app.UsageError(str(e)) from e
  print(json.dumps(report, indent=1))


if __name__ == "__main__":
  _define_flags()
  cli.run(main)
