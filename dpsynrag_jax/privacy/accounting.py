"""Privacy accounting for DP-SynRAG on the host (NumPy): Theorem 1, conversions, DpEvents,
calibration.

Theorem 1 of the paper (zCDP, add/remove one document; each document is in at most L clusters):

  rho = K / (2 sigma_h^2)                         keyword histogram, Gaussian, L2 sensitivity sqrt(K)
      + L * ( eps_theta^2 / 8                      threshold exponential mechanism, per cluster
            + 1 / (2 sigma_mu^2)                   noisy embedding sum, Gaussian, sensitivity 1
            + T / 2 * (c / tau)^2 )                T token steps, each an EM of range 2c/tau
  eps = rho + sqrt(4 rho log(1/delta))

With topic terms (synrag.topics, off in the paper) each cluster also pays m * eps_topic^2 / 8
for its m terms, each an eps_topic-bounded-range exponential mechanism. Discovering those terms
in the corpus (privacy.partition_selection, off in the paper) adds a global m_t / (2 sigma_t^2)
and spends delta_t of delta: every conversion below then runs at delta - delta_t.

Two ways to spend an (epsilon, delta) budget:
  * 'closed_form': the conversion above, as in the paper.
  * 'rdp': the same zCDP events handed to dp_accounting's RdpAccountant, whose RDP -> (eps, delta)
    conversion (Canonne-Kamath-Steinke / Asoodeh et al.) is tighter, so the same budget buys a
    larger token clipping bound c.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import dp_accounting
from dp_accounting import rdp as dp_rdp
import numpy as np

from dpsynrag_jax.privacy import costs

ACCOUNTANTS = ("closed_form", "rdp")
DEFAULT_ORDERS = tuple(dp_rdp.rdp_privacy_accountant.DEFAULT_RDP_ORDERS)


def _positive(name, value):
  if not (math.isfinite(value) and value > 0):
    raise ValueError(f"{name} must be finite and > 0, got {value!r}.")


def _delta(delta):
  if not 0 < delta < 1:
    raise ValueError(f"delta must be in (0, 1), got {delta!r}.")


# The free public tokens of the sparse vector test (SparseVectorSelector): a text pays for at
# most `paid` tokens, each with its own AboveThreshold instance. svt_share is the part of a
# paid token's zCDP cost that goes to its test: rho_test = svt_share / (1 - svt_share) *
# (c/tau)^2 / 2, so the per-cluster cost paid * (c/tau)^2 / (2 (1 - svt_share)) is still
# a + b c^2 and c is calibrated as for the paper's T tokens.


def _svt_share(svt_share: float) -> float:
  if not 0 < svt_share < 1:
    raise ValueError(f"svt_share must be in (0, 1), got {svt_share!r}.")
  return svt_share


def svt_epsilon_test(c: float, tau: float, svt_share: float) -> float:
  """epsilon of each AboveThreshold instance when it takes svt_share of a paid token's rho."""
  _svt_share(svt_share)
  return (c / tau) * math.sqrt(svt_share / (1.0 - svt_share))


def token_steps_rho(count: int, c: float, tau: float, svt_share: float = 0.0) -> float:
  """zCDP of a cluster's `count` paid tokens, with their tests when svt_share > 0."""
  rho = costs.tokens_rho(count, c, tau)
  if svt_share:
    rho += costs.sparse_vector_rho(count, svt_epsilon_test(c, tau, svt_share))
  return rho


def token_steps_event(count: int, c: float, tau: float,
                      svt_share: float = 0.0) -> dp_accounting.DpEvent:
  tokens = costs.tokens_event(count, c, tau)
  if not svt_share:
    return tokens
  return dp_accounting.ComposedDpEvent([
      tokens, costs.sparse_vector_event(count, svt_epsilon_test(c, tau, svt_share))])


# Closed form.


def theorem1_rho(K, sigma_h, L, eps_theta, sigma_mu, T, c, tau, svt_share=0.0,
                 topic_count=0, eps_topic=0.0, terms_m=0, sigma_terms=0.0) -> float:
  """Total zCDP rho of one DP-SynRAG run (Theorem 1). T is the tokens paid per cluster: all
  of them for the paper's method, at most `paid` with the sparse vector test (svt_share);
  topic_count terms of eps_topic per cluster when topic terms are on; the term discovery's
  Gaussian (terms_m terms a document, noise sigma_terms) when it runs."""
  per_cluster = (costs.exponential_rho(eps_theta) + costs.gaussian_rho(1.0, sigma_mu) +
                 token_steps_rho(T, c, tau, svt_share))
  if topic_count:
    per_cluster += costs.topic_terms_rho(topic_count, eps_topic)
  discovery = costs.gaussian_rho(math.sqrt(terms_m), sigma_terms) if terms_m else 0.0
  return costs.gaussian_rho(math.sqrt(K), sigma_h) + discovery + L * per_cluster


def zcdp_to_eps(rho: float, delta: float) -> float:
  """(eps, delta)-DP implied by rho-zCDP: rho + sqrt(4 rho log(1/delta)) (Bun & Steinke 2016)."""
  _delta(delta)
  if rho < 0:
    raise ValueError(f"rho must be >= 0, got {rho!r}.")
  return rho + math.sqrt(4.0 * rho * math.log(1.0 / delta))


def eps_to_zcdp(eps: float, delta: float) -> float:
  """The largest rho whose `zcdp_to_eps` is eps: (sqrt(eps + log 1/delta) - sqrt(log 1/delta))^2."""
  _delta(delta)
  if eps < 0:
    raise ValueError(f"eps must be >= 0, got {eps!r}.")
  log_inv = math.log(1.0 / delta)
  return (math.sqrt(eps + log_inv) - math.sqrt(log_inv))**2


# dp_accounting events.


def cluster_dp_event(eps_theta, sigma_mu, T, c, tau, svt_share=0.0, topic_count=0,
                     eps_topic=0.0) -> dp_accounting.DpEvent:
  """The releases of one cluster: threshold EM, noisy embedding sum, its topic terms if any,
  T paid token steps."""
  events = [costs.exponential_event(eps_theta),
            costs.gaussian_event(1.0, sigma_mu)]    # the embedding sum has sensitivity 1
  if topic_count:
    events.append(costs.topic_terms_event(topic_count, eps_topic))
  events.append(token_steps_event(T, c, tau, svt_share))
  return dp_accounting.ComposedDpEvent(events)


def run_dp_event(K, sigma_h, L, eps_theta, sigma_mu, T, c, tau, svt_share=0.0,
                 topic_count=0, eps_topic=0.0, terms_m=0,
                 sigma_terms=0.0) -> dp_accounting.DpEvent:
  """The DpEvent of a whole run: the histogram, the term discovery's Gaussian if it runs (its
  delta is not an event: convert at delta - delta_t), then L clusters' worth of per-cluster
  releases.

  A document sits in at most L clusters and the clusters hold disjoint releases, so a document's
  privacy loss is that of L sequential clusters (parallel composition across the rest).
  """
  discovery = [costs.gaussian_event(math.sqrt(terms_m), sigma_terms)] if terms_m else []
  return dp_accounting.ComposedDpEvent([
      costs.gaussian_event(math.sqrt(K), sigma_h), *discovery,
      dp_accounting.SelfComposedDpEvent(
          cluster_dp_event(eps_theta, sigma_mu, T, c, tau, svt_share, topic_count, eps_topic),
          int(L)),
  ])


def rdp_accountant(event: dp_accounting.DpEvent | None = None,
                   orders: Sequence[float] = DEFAULT_ORDERS) -> dp_rdp.RdpAccountant:
  """A fresh add/remove-one RdpAccountant, with `event` composed when given."""
  accountant = dp_rdp.RdpAccountant(list(orders))
  if event is not None:
    accountant.compose(event)
  return accountant


def rdp_epsilon(event: dp_accounting.DpEvent, delta: float,
                orders: Sequence[float] = DEFAULT_ORDERS) -> float:
  """epsilon at `delta` of `event` by dp_accounting's RDP accountant."""
  _delta(delta)
  return float(rdp_accountant(event, orders).get_epsilon(delta))


def rho_from_rdp(orders: np.ndarray, rdp: np.ndarray, rtol: float = 1e-9) -> float:
  """rho of an RDP curve that is rho * alpha at every order (what every zCDP / Gaussian event
  here gives). Raises ValueError if the curve is not linear, i.e. not plain zCDP."""
  ratios = np.asarray(rdp, np.float64) / np.asarray(orders, np.float64)
  rho = float(np.max(ratios))
  if not np.allclose(ratios, rho, rtol=rtol, atol=0.0):
    raise ValueError("RDP curve is not rho * alpha: the event is not plain zCDP.")
  return rho


def rdp_rho(event: dp_accounting.DpEvent, orders: Sequence[float] = DEFAULT_ORDERS) -> float:
  """rho of `event` read off dp_accounting's RDP curve."""
  accountant = rdp_accountant(event, orders)
  return rho_from_rdp(accountant.orders, accountant.rdp)


# Calibration.


@dataclasses.dataclass(frozen=True)
class Calibration:
  """Noise parameters that spend exactly an (epsilon, delta) budget under `accountant`."""
  epsilon: float
  delta: float
  accountant: str
  K: int
  L: int
  T: int
  tau: float
  sigma_h: float
  sigma_mu: float
  eps_theta: float
  c: float
  svt_paid: int = 0         # > 0: the sparse vector test, at most this many paid tokens a text
  svt_share: float = 0.0    # the part of a paid token's rho that goes to its test
  topic_count: int = 0      # > 0: topic terms drawn per cluster (synrag.topics)
  eps_topic: float = 0.0    # epsilon of each topic term's exponential mechanism
  terms_m: int = 0          # > 0: term discovery, at most this many terms a document
  sigma_terms: float = 0.0  # its noise
  terms_threshold: float = 0.0   # its release threshold
  delta_terms: float = 0.0  # the delta it spends (the rest is converted at delta - this)

  @property
  def delta_rest(self) -> float:
    """The delta at which the zCDP part is converted (all of it without term discovery)."""
    return self.delta - self.delta_terms

  @property
  def paid_tokens(self) -> int:
    """Tokens charged per cluster: T, or svt_paid with the sparse vector test."""
    return self.svt_paid or self.T

  @property
  def epsilon_test(self) -> float:
    """epsilon of each AboveThreshold instance (sparse vector test only)."""
    if not self.svt_paid:
      raise ValueError("This calibration has no sparse vector test (svt_paid = 0).")
    return svt_epsilon_test(self.c, self.tau, self.svt_share)

  @property
  def c_over_tau(self) -> float:
    return self.c / self.tau

  @property
  def per_token_eps(self) -> float:
    return 2.0 * self.c / self.tau

  @property
  def per_token_rho(self) -> float:
    return costs.tokens_rho(1, self.c, self.tau)

  @property
  def rho_total(self) -> float:
    return theorem1_rho(self.K, self.sigma_h, self.L, self.eps_theta, self.sigma_mu,
                        self.paid_tokens, self.c, self.tau, self.svt_share, self.topic_count,
                        self.eps_topic, self.terms_m, self.sigma_terms)

  def dp_event(self) -> dp_accounting.DpEvent:
    return run_dp_event(self.K, self.sigma_h, self.L, self.eps_theta, self.sigma_mu,
                        self.paid_tokens, self.c, self.tau, self.svt_share, self.topic_count,
                        self.eps_topic, self.terms_m, self.sigma_terms)

  def eps_closed_form(self) -> float:
    return zcdp_to_eps(self.rho_total, self.delta_rest)

  def eps_rdp(self, orders: Sequence[float] = DEFAULT_ORDERS) -> float:
    return rdp_epsilon(self.dp_event(), self.delta_rest, orders)


def calibrate(epsilon: float, delta: float, *, K: int = 10, L: int = 5, T: int = 70,
              tau: float = 1.0, rho_hist: float = 0.1, eps_theta: float = 0.4,
              rho_retr: float = 0.009, accountant: str = "closed_form",
              orders: Sequence[float] = DEFAULT_ORDERS, svt_paid: int = 0,
              svt_share: float = 0.5, topic_count: int = 0,
              topic_share: float = 0.0, terms_m: int = 0, rho_terms: float = 0.0,
              delta_terms: float = 0.0) -> Calibration:
  """Chooses sigma_h, sigma_mu and c so that a run spends exactly (epsilon, delta).

  The histogram gets rho_hist (sigma_h = sqrt(K / (2 rho_hist))); each cluster's embedding sum
  gets rho_retr read as the Gaussian part 1/(2 sigma_mu^2) (the paper's printed 0.009 is below
  eps_theta^2/8 = 0.02, so it cannot include the threshold EM); the threshold EM costs
  eps_theta^2/8 per cluster on top; whatever is left goes to the L*T token steps via c.

  accountant='closed_form' inverts Theorem 1's conversion exactly; accountant='rdp' finds c by
  dp_accounting's calibrate_dp_mechanism so that the RdpAccountant's epsilon at delta equals
  `epsilon` (to a tolerance of 1e-12 in c).

  svt_paid > 0 calibrates the sparse vector test instead of T private tokens: each text pays
  for at most svt_paid tokens, each with an AboveThreshold instance that takes svt_share of
  the paid token's zCDP (svt_epsilon_test); both accountants read the same events.

  topic_count > 0 draws that many topic terms per cluster (synrag.topics). They take
  topic_share of what each cluster has left after its threshold and embedding sum, split in the
  closed form: rho_topics = topic_share * (rho(epsilon, delta) - rho_hist - L * (eps_theta^2 / 8
  + rho_retr)) / L, so eps_topic = sqrt(8 rho_topics / topic_count); the tokens' c is then
  calibrated on top of that, under either accountant, like every other fixed part.

  terms_m > 0 discovers the topic terms in the corpus first (privacy.partition_selection): its
  Gaussian takes rho_terms (sigma_t = sqrt(terms_m / (2 rho_terms))), its threshold spends
  delta_terms of delta, and everything above is calibrated at delta - delta_terms.

  Raises ValueError when the fixed parts alone exceed the budget.
  """
  _positive("epsilon", epsilon)
  _delta(delta)
  discovery = _discovery(delta, terms_m, rho_terms, delta_terms)
  cal = _calibrate_zcdp_part(epsilon, delta - discovery["delta_terms"], K=K, L=L, T=T, tau=tau,
                             rho_hist=rho_hist, eps_theta=eps_theta, rho_retr=rho_retr,
                             accountant=accountant, orders=orders, svt_paid=svt_paid,
                             svt_share=svt_share, topic_count=topic_count,
                             topic_share=topic_share, terms_m=discovery["terms_m"],
                             sigma_terms=discovery["sigma_terms"])
  return dataclasses.replace(cal, delta=delta, **discovery)


def _discovery(delta, terms_m, rho_terms, delta_terms) -> dict:
  """The term discovery's Calibration fields (all 0 when terms_m = 0)."""
  if isinstance(terms_m, bool) or int(terms_m) != terms_m or terms_m < 0:
    raise ValueError(f"terms_m must be an integer >= 0, got {terms_m!r}.")
  if not terms_m:
    return dict(terms_m=0, sigma_terms=0.0, terms_threshold=0.0, delta_terms=0.0)
  _positive("rho_terms", rho_terms)
  if not 0 < delta_terms < delta:
    raise ValueError(f"The term discovery's delta must be in (0, delta = {delta:g}), got "
                     f"{delta_terms!r}.")
  sigma = math.sqrt(terms_m / (2.0 * rho_terms))
  threshold = costs.partition_selection_threshold(int(terms_m), sigma, delta_terms)
  return dict(terms_m=int(terms_m), sigma_terms=sigma, terms_threshold=threshold,
              delta_terms=costs.partition_selection_delta(int(terms_m), sigma, threshold))


def _calibrate_zcdp_part(epsilon, delta, *, K, L, T, tau, rho_hist, eps_theta, rho_retr,
                         accountant, orders, svt_paid, svt_share, topic_count, topic_share,
                         terms_m, sigma_terms) -> Calibration:
  """calibrate() of everything but the discovery's delta, at `delta` (what it left)."""
  for name, value in dict(K=K, L=L, tau=tau, rho_hist=rho_hist, eps_theta=eps_theta,
                          rho_retr=rho_retr).items():
    _positive(name, value)
  if accountant not in ACCOUNTANTS:
    raise ValueError(f"accountant must be one of {ACCOUNTANTS}, got {accountant!r}.")
  if T == 0:
    return _calibrate_openings_only(epsilon, delta, K=K, L=L, tau=tau, rho_hist=rho_hist,
                                    eps_theta=eps_theta, rho_retr=rho_retr,
                                    accountant=accountant, orders=orders,
                                    topic_count=topic_count, topic_share=topic_share,
                                    terms_m=terms_m, sigma_terms=sigma_terms)
  _positive("T", T)
  if topic_share == 1.0:
    raise ValueError("topic_share=1 leaves nothing for the T tokens; it is for openings-only "
                     "texts (generation.T=0).")
  if svt_paid < 0 or svt_paid > T:
    raise ValueError(f"svt_paid must be in 0 .. T = {T}, got {svt_paid}.")
  share = _svt_share(svt_share) if svt_paid else 0.0
  paid = svt_paid or T
  sigma_h = math.sqrt(K / (2.0 * rho_hist))
  sigma_mu = math.sqrt(1.0 / (2.0 * rho_retr))
  eps_topic = topic_epsilon(epsilon, delta, K=K, L=L, sigma_h=sigma_h, eps_theta=eps_theta,
                            sigma_mu=sigma_mu, topic_count=topic_count, topic_share=topic_share,
                            terms_m=terms_m, sigma_terms=sigma_terms)
  c = calibrate_c(
      epsilon, delta, accountant=accountant, orders=orders,
      event_of_c=lambda c: run_dp_event(K, sigma_h, L, eps_theta, sigma_mu, paid, c, tau,
                                        share, topic_count, eps_topic, terms_m, sigma_terms),
      rho_of_c=lambda c: theorem1_rho(K, sigma_h, L, eps_theta, sigma_mu, paid, c, tau, share,
                                      topic_count, eps_topic, terms_m, sigma_terms),
      what="The histogram, thresholds, embedding sums" +
           (" and topic terms" if topic_count else "") +
           (" with the term discovery" if terms_m else ""))
  return Calibration(epsilon=epsilon, delta=delta, accountant=accountant, K=K, L=L, T=T,
                     tau=tau, sigma_h=sigma_h, sigma_mu=sigma_mu, eps_theta=eps_theta, c=c,
                     svt_paid=svt_paid, svt_share=share, topic_count=topic_count,
                     eps_topic=eps_topic)


def _calibrate_openings_only(epsilon, delta, *, K, L, tau, rho_hist, eps_theta, rho_retr,
                             accountant, orders, topic_count, topic_share, terms_m,
                             sigma_terms) -> Calibration:
  """T = 0: each text is its cluster's topic terms alone, which take everything a cluster has
  left after its threshold and embedding sum (topic_share must be 1; c = 0, no token is
  charged). 'closed_form' inverts Theorem 1 exactly; 'rdp' searches eps_topic with
  dp_accounting's calibrate_dp_mechanism so that its RDP epsilon at delta is `epsilon`."""
  if not topic_count:
    raise ValueError("generation.T=0 releases each cluster's topic terms alone; it needs "
                     "generation.topic_terms.")
  if topic_share != 1.0:
    raise ValueError(f"With T=0 no token shares the budget: set topic_share=1 (got "
                     f"{topic_share!r}).")
  sigma_h = math.sqrt(K / (2.0 * rho_hist))
  sigma_mu = math.sqrt(1.0 / (2.0 * rho_retr))
  try:
    eps_topic = topic_epsilon(epsilon, delta, K=K, L=L, sigma_h=sigma_h, eps_theta=eps_theta,
                              sigma_mu=sigma_mu, topic_count=topic_count, topic_share=1.0,
                              terms_m=terms_m, sigma_terms=sigma_terms)
  except ValueError:
    if accountant != "rdp":
      raise
    # The closed form has nothing left, the tighter RDP conversion may: search from a small
    # guess (calibrate_dp_mechanism refuses if even eps_topic -> 0 exceeds the budget).
    eps_topic = 1e-3
  if accountant == "rdp":
    event_of = lambda e: run_dp_event(K, sigma_h, L, eps_theta, sigma_mu, 0, 0.0, tau, 0.0,
                                      topic_count, e, terms_m, sigma_terms)
    if rdp_epsilon(event_of(0.0), delta, orders) >= epsilon:
      raise ValueError(
          f"The histogram, {'term discovery, ' if terms_m else ''}thresholds and embedding "
          f"sums alone spend epsilon >= {epsilon:g} at delta {delta:g} (RDP): nothing is left "
          "for topic terms.")
    eps_topic = float(dp_accounting.calibrate_dp_mechanism(
        lambda: dp_rdp.RdpAccountant(list(orders)), event_of, epsilon, delta,
        bracket_interval=dp_accounting.LowerEndpointAndGuess(0.0, eps_topic), tol=1e-12))
  return Calibration(epsilon=epsilon, delta=delta, accountant=accountant, K=K, L=L, T=0,
                     tau=tau, sigma_h=sigma_h, sigma_mu=sigma_mu, eps_theta=eps_theta, c=0.0,
                     topic_count=topic_count, eps_topic=eps_topic)


def topic_epsilon(epsilon: float, delta: float, *, K: int, L: int, sigma_h: float,
                  eps_theta: float, sigma_mu: float, topic_count: int,
                  topic_share: float, terms_m: int = 0, sigma_terms: float = 0.0) -> float:
  """eps_topic of each of a cluster's topic_count terms when they take topic_share of the
  cluster's rho left after its threshold and embedding sum, and after the term discovery when
  it runs (0.0 without topic terms)."""
  if isinstance(topic_count, bool) or int(topic_count) != topic_count or topic_count < 0:
    raise ValueError(f"topic_count must be an integer >= 0, got {topic_count!r}.")
  if not topic_count:
    return 0.0
  if not 0 < topic_share <= 1:
    raise ValueError(f"topic_share must be in (0, 1] with topic terms, got {topic_share!r}.")
  fixed = theorem1_rho(K, sigma_h, L, eps_theta, sigma_mu, 1, 0.0, 1.0, terms_m=terms_m,
                       sigma_terms=sigma_terms)
  left = eps_to_zcdp(epsilon, delta) - fixed
  if left <= 0:
    raise ValueError(
        f"The histogram, {'term discovery, ' if terms_m else ''}thresholds and embedding sums "
        f"alone cost rho = {fixed:.4g}, which is "
        f"not below the budget's rho = {eps_to_zcdp(epsilon, delta):.4g}: nothing is left "
        "for topic terms.")
  return math.sqrt(8.0 * topic_share * left / L / topic_count)


def calibrate_c(epsilon: float, delta: float, *, event_of_c, rho_of_c, accountant: str,
                orders: Sequence[float] = DEFAULT_ORDERS, what: str = "The fixed mechanisms"
                ) -> float:
  """The token clipping bound c at which a run spends exactly (epsilon, delta).

  Args:
    event_of_c: c -> the run's DpEvent (for accountant='rdp').
    rho_of_c: c -> the run's zCDP rho, of the form a + b c^2 (every run here: Gaussian and
      exponential mechanisms, then tokens); inverted in closed form for 'closed_form'.
    accountant: 'closed_form' (Theorem 1's zCDP conversion) or 'rdp' (dp_accounting's RDP
      accountant; calibrate_dp_mechanism on c to 1e-12, starting from the closed form, which
      its tighter conversion usually raises; at very large epsilon its finite orders can
      afford slightly less, and the search then goes down).
    what: the fixed mechanisms, named in the error when they alone exceed the budget.

  Raises ValueError when the mechanisms other than the tokens already spend the budget.
  """
  _positive("epsilon", epsilon)
  _delta(delta)
  if accountant not in ACCOUNTANTS:
    raise ValueError(f"accountant must be one of {ACCOUNTANTS}, got {accountant!r}.")
  fixed_rho = rho_of_c(0.0)
  per_c2 = rho_of_c(1.0) - fixed_rho
  rho_total = eps_to_zcdp(epsilon, delta)
  if rho_total - fixed_rho <= 0:
    raise ValueError(
        f"{what} alone cost rho = {fixed_rho:.4g}, which is not below the budget's rho = "
        f"{rho_total:.4g} (epsilon={epsilon}, delta={delta}).")
  c_closed = math.sqrt((rho_total - fixed_rho) / per_c2)
  if accountant == "closed_form":
    return c_closed
  # c = 0 (no token cost) is inside the budget; c_closed is a good first guess (the RDP
  # conversion is tighter, so the answer usually lies above it and the search doubles once).
  return float(dp_accounting.calibrate_dp_mechanism(
      lambda: dp_rdp.RdpAccountant(list(orders)), event_of_c, epsilon, delta,
      bracket_interval=dp_accounting.LowerEndpointAndGuess(0.0, c_closed), tol=1e-12))


# The baselines' budgets (the same cost functions, the same two accountants).


def calibrate_dp_synth(epsilon: float, delta: float, *, T: int, tau: float = 1.0,
                       accountant: str = "closed_form") -> float:
  """c of DP-Synth: each document is in one batch and a batch releases T tokens, so by
  parallel composition over batches a document's loss is T tokens'."""
  _positive("T", T)
  return calibrate_c(epsilon, delta, accountant=accountant,
                     event_of_c=lambda c: costs.tokens_event(T, c, tau),
                     rho_of_c=lambda c: costs.tokens_rho(T, c, tau), what="Nothing")


def _dp_rag_question(eps_r: float, T: int, c: float, tau: float) -> dp_accounting.DpEvent:
  """One DP-RAG question: its retrieval threshold, then T tokens."""
  return dp_accounting.ComposedDpEvent([costs.exponential_event(eps_r),
                                        costs.tokens_event(T, c, tau)])


def dp_rag_epsilon(num_queries: int, eps_r: float, c: float, *, T: int, tau: float,
                   delta: float, accountant: str = "closed_form") -> float:
  """Epsilon at `delta` of num_queries DP-RAG questions of parameters (eps_r, c), by the
  accountant the ledger reads (what questions calibrated one by one compose to)."""
  _positive("num_queries", num_queries)
  if accountant == "closed_form":
    return zcdp_to_eps(num_queries * (costs.exponential_rho(eps_r) + costs.tokens_rho(T, c, tau)),
                       delta)
  return rdp_epsilon(dp_accounting.SelfComposedDpEvent(_dp_rag_question(eps_r, T, c, tau),
                                                       int(num_queries)), delta)


def calibrate_dp_rag(epsilon_total: float, delta: float, *, num_queries: int, T: int,
                     tau: float = 1.0, retrieval_share: float = 0.1,
                     accountant: str = "closed_form") -> tuple[float, float]:
  """(eps_r, c) of DP-RAG: num_queries questions in sequence, each a threshold EM of eps_r and
  T tokens; the threshold takes retrieval_share of a question's zCDP share of the budget, the
  tokens take the rest (under 'rdp', c is then raised until the RDP accountant reads exactly
  epsilon_total)."""
  _positive("num_queries", num_queries)
  _positive("T", T)
  if not 0 < retrieval_share < 1:
    raise ValueError(f"retrieval_share must be in (0, 1), got {retrieval_share!r}.")
  rho_q = eps_to_zcdp(epsilon_total, delta) / num_queries
  eps_r = math.sqrt(8.0 * retrieval_share * rho_q)
  question = lambda c: _dp_rag_question(eps_r, T, c, tau)
  c = calibrate_c(
      epsilon_total, delta, accountant=accountant,
      event_of_c=lambda c: dp_accounting.SelfComposedDpEvent(question(c), int(num_queries)),
      rho_of_c=lambda c: num_queries * (costs.exponential_rho(eps_r) +
                                        costs.tokens_rho(T, c, tau)),
      what="The retrieval thresholds")
  return eps_r, c
