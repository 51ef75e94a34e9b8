"""Bounded-range (BR) mechanisms: their worst case, and tighter RDP than the zCDP bound.

A mechanism M is eps0-BR when, for neighbouring data sets, its privacy loss
L(y) = log P(M(D) = y) / P(M(D') = y) takes values in an interval [t - eps0, t] of width eps0
for some t in [0, eps0] (Durfee & Rogers 2019). The exponential mechanism with utilities that
one record moves within a range of width Delta, at scale 1/tau, is (Delta / tau)-BR; a private
token here is the exponential mechanism over clipped sums that one document moves within
[-c, c], so it is (2c / tau)-BR (privacy/costs.py).

The worst case (Dong, Durfee & Rogers 2020, generalized randomized response): for fixed t,
the privacy loss distribution that maximises any convex functional of the likelihood ratio puts
all its mass on the interval's ends, L = t with probability q_t and L = t - eps0 otherwise,
where E_P[e^-L] = 1 fixes

  q_t = (e^(eps0 - t) - 1) / (e^(eps0 - t) - e^-t).

Renyi divergence of order alpha, E_P[e^((alpha - 1) L)], is such a functional (u -> u^(1-alpha)
is convex in u = e^-L), so an eps0-BR mechanism is (alpha, rdp(alpha))-RDP with

  rdp(alpha) = sup_t 1/(alpha - 1) log(q_t e^((alpha-1) t) + (1 - q_t) e^((alpha-1)(t - eps0))),

and RDP composes adaptively: each token step's t may depend on the tokens before it (it does:
the clipped sums are taken after the text so far). This curve lies below the zCDP bound
alpha eps0^2 / 8 (Cesar & Rogers 2021) at every order, by a margin that grows with eps0.

Pure NumPy (host-side accounting never imports a device library).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

# The sup over t is found on a grid of _GRID points then refined by golden-section search on
# the best grid cell; the objective is smooth and unimodal in t (checked against a dense grid
# in tests/test_privacy_bounded_range.py). A relative margin keeps the numerical optimum an
# upper bound.
_GRID = 257
_REFINE_STEPS = 60
_MARGIN = 1e-9


def _positive(name: str, value: float) -> None:
  if not (math.isfinite(value) and value > 0):
    raise ValueError(f"{name} must be finite and > 0, got {value!r}.")


def worst_case_pair(eps0: float, t: float) -> tuple[float, float, float]:
  """(q_t, t, t - eps0): P-probability of the top loss, and the two loss values."""
  _positive("eps0", eps0)
  if not 0.0 <= t <= eps0:
    raise ValueError(f"t must be in [0, eps0] = [0, {eps0}], got {t!r}.")
  # expm1 keeps q_t accurate for small eps0 (e^x - 1 loses digits there).
  q = math.expm1(eps0 - t) / (math.expm1(eps0 - t) - math.expm1(-t)) if eps0 > 0 else 1.0
  return q, t, t - eps0


def _renyi_at(eps0: float, t: np.ndarray, alpha: float) -> np.ndarray:
  """Renyi divergence of order alpha of the worst-case pair at each t (vectorised in t)."""
  q = np.expm1(eps0 - t) / (np.expm1(eps0 - t) - np.expm1(-t))
  a = alpha - 1.0
  # log(q e^(a t) + (1 - q) e^(a (t - eps0))) = a t + log(q + (1 - q) e^(-a eps0))
  return (a * t + np.log(q + (1.0 - q) * np.exp(-a * eps0))) / a


def _sup_over_t(eps0: float, alpha: float) -> float:
  """sup_t of _renyi_at (t in the open interval; the ends are limits of the interior)."""
  grid = np.linspace(0.0, eps0, _GRID)[1:-1]
  values = _renyi_at(eps0, grid, alpha)
  best = int(np.argmax(values))
  lo = grid[best - 1] if best > 0 else grid[0] * 1e-6
  hi = grid[best + 1] if best + 1 < len(grid) else eps0 - (eps0 - grid[-1]) * 1e-6
  ratio = (math.sqrt(5.0) - 1.0) / 2.0
  a, b = lo + (1 - ratio) * (hi - lo), lo + ratio * (hi - lo)
  fa, fb = (float(_renyi_at(eps0, np.array([x]), alpha)[0]) for x in (a, b))
  for _ in range(_REFINE_STEPS):
    if fa >= fb:
      hi, b, fb = b, a, fa
      a = lo + (1 - ratio) * (hi - lo)
      fa = float(_renyi_at(eps0, np.array([a]), alpha)[0])
    else:
      lo, a, fa = a, b, fb
      b = lo + ratio * (hi - lo)
      fb = float(_renyi_at(eps0, np.array([b]), alpha)[0])
  return max(float(values[best]), fa, fb)


def br_rdp(eps0: float, orders: Sequence[float]) -> np.ndarray:
  """RDP curve [len(orders)] of one eps0-BR mechanism: the sup over t above, capped by the
  zCDP bound alpha eps0^2 / 8 (both are valid; the cap only guards the numerics)."""
  orders = np.asarray(orders, np.float64)
  if eps0 == 0:
    return np.zeros_like(orders)
  _positive("eps0", eps0)
  if np.any(orders <= 1):
    raise ValueError("RDP orders must be > 1.")
  sup = np.array([_sup_over_t(eps0, float(a)) for a in orders])
  return np.minimum(sup * (1.0 + _MARGIN), orders * eps0**2 / 8.0)


def nonadaptive_delta(eps0: float, k: int, epsilon: float, t: float) -> float:
  """delta at `epsilon` of k independent copies of the worst-case pair at the same t (the
  generalized randomized response composition of Dong, Durfee & Rogers 2020):

    delta = sum_i C(k, i) q^i (1 - q)^(k - i) (1 - e^(epsilon - l_i))_+,
    l_i = i t + (k - i)(t - eps0)

  A reference for tests and reports, not an accountant: the token steps are adaptive, and
  adaptivity can cost more than this (the paper's "cost of adaptivity")."""
  q, top, bottom = worst_case_pair(eps0, t)
  i = np.arange(k + 1)
  log_binom = np.array([math.lgamma(k + 1) - math.lgamma(j + 1) - math.lgamma(k - j + 1)
                        for j in i])
  with np.errstate(divide="ignore"):
    log_w = log_binom + i * math.log(q) + (k - i) * (math.log1p(-q) if q < 1 else -np.inf)
  losses = i * top + (k - i) * bottom
  gain = -np.expm1(np.minimum(epsilon - losses, 0.0))   # (1 - e^(eps - l))_+
  return float(np.sum(np.exp(log_w) * gain))


def worst_case_kl(eps0: float) -> float:
  """sup_t E_P[L] over the worst-case pairs: the largest mean privacy loss (KL divergence) of an
  eps0-BR mechanism, v - 1 - log v with v = eps0 / (1 - e^-eps0); about eps0^2/8 - eps0^4/1152."""
  if eps0 == 0:
    return 0.0
  _positive("eps0", eps0)
  v = eps0 / -math.expm1(-eps0)
  return v - 1.0 - math.log(v)


def azuma_epsilon(bounded_range_steps: Sequence[tuple[float, int]], gaussian_rho: float,
                  delta: float) -> float:
  """epsilon at delta of an adaptive sequence of BR steps and Gaussian mechanisms, by the
  martingale (Azuma-Hoeffding) bound that Dong, Durfee & Rogers 2020 give for BR mechanisms
  (their efficiently computable adaptive bound), with the Gaussians folded in:

    eps = sum_i n_i KL*(eps_i) + rho_G + sqrt(2 log(1/delta) (sum_i n_i eps_i^2 / 4 + 2 rho_G))

  Each BR step's loss, given the past, has mean <= KL*(eps_i) and lies in an interval of width
  eps_i (sub-Gaussian with variance proxy eps_i^2 / 4); a rho-zCDP Gaussian's loss is
  N(rho, 2 rho). The tail term equals zCDP's 2 sqrt(rho log(1/delta)), so this bound only
  replaces the mean eps_i^2 / 8 by KL*(eps_i), which is smaller by O(eps_i^4).

  Args:
    bounded_range_steps: (eps0, count) pairs.
    gaussian_rho: total zCDP rho of the Gaussian mechanisms.
  """
  if not 0 < delta < 1:
    raise ValueError(f"delta must be in (0, 1), got {delta!r}.")
  mean = sum(n * worst_case_kl(e) for e, n in bounded_range_steps) + gaussian_rho
  proxy = sum(n * e * e / 4.0 for e, n in bounded_range_steps) + 2.0 * gaussian_rho
  return mean + math.sqrt(2.0 * math.log(1.0 / delta) * proxy)
