"""What each mechanism kind costs, written once: zCDP rho and the dp_accounting DpEvent.

The ledger, Theorem 1 (`accounting.theorem1_rho`, `accounting.run_dp_event`), every calibration
and the mechanisms' docstrings read these functions; nothing else writes a cost formula.

  kind          parameters               rho                       DpEvent
  gaussian      sensitivity, sigma       s^2 / (2 sigma^2)         GaussianDpEvent(sigma / s)
  exponential   epsilon                  epsilon^2 / 8             ZCDpEvent (bounded range)
  tokens        count, c, tau            count (c/tau)^2 / 2       count x ZCDpEvent((c/tau)^2/2)
  sparse_vector count, epsilon           count epsilon^2 / 2       count x ZCDpEvent(epsilon^2/2)
  topic_terms   count, epsilon           count epsilon^2 / 8       count x ZCDpEvent(epsilon^2/8)
  partition_    count, sigma, threshold  count / (2 sigma^2)       GaussianDpEvent(sigma/sqrt(count))
    selection                            + delta (below)

The exponential mechanism with an epsilon-DP parameter is bounded range, hence epsilon^2/8-zCDP
(Cesar & Rogers 2021). A private token is the exponential mechanism over utilities that each
document moves within [-c, c] (range 2c): epsilon = 2c/tau, rho = (c/tau)^2 / 2. An instance of
the sparse vector test (AboveThreshold) is epsilon-DP and not bounded range, so it is charged
the pure-DP conversion epsilon^2 / 2 (Bun & Steinke 2016, Proposition 1.4). A cluster's topic
terms are `count` exponential mechanisms of parameter epsilon (bounded range, peeled one after
the other: mechanisms.select_top_terms).

Partition selection (term discovery, privacy.partition_selection) is the one approximate
mechanism: Gaussian noise on the document counts of the terms seen, each document counting at
most `count` distinct terms once (L2 sensitivity sqrt(count)), and a term released only when its
noisy count passes `threshold`. Conditioned on none of an added document's unseen terms passing,
its output is the Gaussian mechanism's; that event fails with probability at most
partition_selection_delta = 1 - Phi((threshold - 1) / sigma)^count, which is added to the run's
delta (approximate zCDP composes rho and delta additively, Bun & Steinke 2016, section 8). Every
other kind has delta 0 (`delta_of`).

Pure Python, dp_accounting and scipy.special only (no JAX), so host-side accounting never imports a device
library.
"""

from __future__ import annotations

import math
from typing import Callable

import dp_accounting
from scipy import special


def gaussian_rho(sensitivity: float, sigma: float) -> float:
  """zCDP cost of N(0, sigma^2) noise on a query of L2 sensitivity `sensitivity`."""
  return sensitivity**2 / (2.0 * sigma**2)


def gaussian_event(sensitivity: float, sigma: float) -> dp_accounting.DpEvent:
  return dp_accounting.GaussianDpEvent(noise_multiplier=sigma / sensitivity)


def exponential_rho(epsilon: float) -> float:
  """zCDP cost of an epsilon-DP (bounded-range) exponential mechanism."""
  return epsilon**2 / 8.0


def exponential_event(epsilon: float) -> dp_accounting.DpEvent:
  return dp_accounting.ZCDpEvent(rho=exponential_rho(epsilon))


def tokens_rho(count: int, c: float, tau: float) -> float:
  """zCDP cost of `count` private tokens at clipping bound c and temperature tau."""
  return count * 0.5 * (c / tau)**2


def tokens_event(count: int, c: float, tau: float) -> dp_accounting.DpEvent:
  return dp_accounting.SelfComposedDpEvent(
      dp_accounting.ZCDpEvent(rho=tokens_rho(1, c, tau)), int(count))


def svt_rho(epsilon: float) -> float:
  """zCDP cost of one epsilon-DP AboveThreshold instance."""
  return 0.5 * epsilon**2


def sparse_vector_rho(count: int, epsilon: float) -> float:
  """zCDP cost of `count` AboveThreshold instances of parameter epsilon."""
  return count * svt_rho(epsilon)


def sparse_vector_event(count: int, epsilon: float) -> dp_accounting.DpEvent:
  return dp_accounting.SelfComposedDpEvent(dp_accounting.ZCDpEvent(rho=svt_rho(epsilon)),
                                           int(count))


def topic_terms_rho(count: int, epsilon: float) -> float:
  """zCDP cost of `count` terms chosen by epsilon-bounded-range exponential mechanisms."""
  return count * exponential_rho(epsilon)


def topic_terms_event(count: int, epsilon: float) -> dp_accounting.DpEvent:
  return dp_accounting.SelfComposedDpEvent(exponential_event(epsilon), int(count))


def partition_selection_rho(count: int, sigma: float, threshold: float) -> float:
  """zCDP cost of the noisy counts of partition selection (count distinct terms a document)."""
  del threshold   # it sets the delta, not rho
  return gaussian_rho(math.sqrt(count), sigma)


def partition_selection_event(count: int, sigma: float,
                              threshold: float) -> dp_accounting.DpEvent:
  del threshold
  return gaussian_event(math.sqrt(count), sigma)


def partition_selection_delta(count: int, sigma: float, threshold: float) -> float:
  """The chance that any of an added document's `count` terms that no other document holds
  passes the threshold: 1 - Phi((threshold - 1) / sigma)^count (each such term's noisy count is
  1 + N(0, sigma^2))."""
  # log Phi keeps the tiny deltas exact: 1 - exp(count * log Phi(z)).
  return float(-math.expm1(count * special.log_ndtr((threshold - 1.0) / sigma)))


def partition_selection_threshold(count: int, sigma: float, delta: float) -> float:
  """The threshold at which partition selection of noise sigma, `count` terms a document,
  spends `delta`: 1 + sigma * z with Phi(z)^count = 1 - delta (partition_selection_delta's
  inverse)."""
  if not (math.isfinite(sigma) and sigma > 0):
    raise ValueError(f"sigma must be finite and > 0, got {sigma!r}.")
  if isinstance(count, bool) or int(count) != count or count < 1:
    raise ValueError(f"count (terms per document) must be an integer >= 1, got {count!r}.")
  if not 0 < delta < 1:
    raise ValueError(f"delta must be in (0, 1), got {delta!r}.")
  # Per term: Q(z) = 1 - (1 - delta)^(1/count), computed without cancellation for tiny delta.
  per_term = -math.expm1(math.log1p(-delta) / count)
  return 1.0 + sigma * float(-special.ndtri(per_term))


# kind -> (parameter names in order, rho(**params), DpEvent(**params)).
KINDS: dict[str, tuple[tuple[str, ...], Callable[..., float],
                       Callable[..., dp_accounting.DpEvent]]] = {
    "gaussian": (("sensitivity", "sigma"), gaussian_rho, gaussian_event),
    "exponential": (("epsilon",), exponential_rho, exponential_event),
    "tokens": (("count", "c", "tau"), tokens_rho, tokens_event),
    "sparse_vector": (("count", "epsilon"), sparse_vector_rho, sparse_vector_event),
    "topic_terms": (("count", "epsilon"), topic_terms_rho, topic_terms_event),
    "partition_selection": (("count", "sigma", "threshold"), partition_selection_rho,
                            partition_selection_event),
}

# kind -> delta(**params) of the kinds that are not plain zCDP (added to the run's delta).
DELTAS: dict[str, Callable[..., float]] = {"partition_selection": partition_selection_delta}


def delta_of(kind: str, params: dict) -> float:
  """The delta a release of `kind` adds to the run's (0 for the zCDP kinds)."""
  return DELTAS[kind](**params) if kind in DELTAS else 0.0
