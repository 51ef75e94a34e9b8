"""What each mechanism kind costs, written once: zCDP rho and the dp_accounting DpEvent.

The ledger, Theorem 1 (`accounting.theorem1_rho`, `accounting.run_dp_event`), every calibration
and the mechanisms' docstrings read these functions; nothing else writes a cost formula.

  kind          parameters               rho                       DpEvent
  gaussian      sensitivity, sigma       s^2 / (2 sigma^2)         GaussianDpEvent(sigma / s)
  exponential   epsilon                  epsilon^2 / 8             ZCDpEvent (bounded range)
  tokens        count, c, tau            count (c/tau)^2 / 2       count x ZCDpEvent((c/tau)^2/2)
  sparse_vector count, epsilon           count epsilon^2 / 2       count x ZCDpEvent(epsilon^2/2)
  topic_terms   count, epsilon           count epsilon^2 / 8       count x ZCDpEvent(epsilon^2/8)

The exponential mechanism with an epsilon-DP parameter is bounded range, hence epsilon^2/8-zCDP
(Cesar & Rogers 2021). A private token is the exponential mechanism over utilities that each
document moves within [-c, c] (range 2c): epsilon = 2c/tau, rho = (c/tau)^2 / 2. An instance of
the sparse vector test (AboveThreshold) is epsilon-DP and not bounded range, so it is charged
the pure-DP conversion epsilon^2 / 2 (Bun & Steinke 2016, Proposition 1.4). A cluster's topic
terms are `count` exponential mechanisms of parameter epsilon (bounded range, peeled one after
the other: mechanisms.select_top_terms).

Pure Python and dp_accounting only (no JAX), so host-side accounting never imports a device
library.
"""

from __future__ import annotations

from typing import Callable

import dp_accounting


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


# kind -> (parameter names in order, rho(**params), DpEvent(**params)).
KINDS: dict[str, tuple[tuple[str, ...], Callable[..., float],
                       Callable[..., dp_accounting.DpEvent]]] = {
    "gaussian": (("sensitivity", "sigma"), gaussian_rho, gaussian_event),
    "exponential": (("epsilon",), exponential_rho, exponential_event),
    "tokens": (("count", "c", "tau"), tokens_rho, tokens_event),
    "sparse_vector": (("count", "epsilon"), sparse_vector_rho, sparse_vector_event),
    "topic_terms": (("count", "epsilon"), topic_terms_rho, topic_terms_event),
}
