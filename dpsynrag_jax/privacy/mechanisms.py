"""DP mechanisms in JAX: Gaussian noise, the threshold mechanism, the token mechanism's draw.

Axis letters: N candidates (or scores), V vocabulary, D embedding width.

All functions are jit-able and take an explicit PRNG key. Neighbouring is add/remove one
document throughout. A mechanism's privacy depends on the sensitivity of what it is fed; each
query in `queries.py` states its own, and the `*_rho` / `*_epsilon` helpers (privacy.costs)
turn (sensitivity, parameter) into the cost. Both exponential mechanisms (threshold, token)
are Gumbel-max draws.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from dpsynrag_jax.privacy import costs

# Gumbel noise with 64 random bits per draw (jax's "highest" mode). float32 Gumbel from 23-bit
# uniforms (the default) lies in [-4.47, 16.64]: a candidate whose utility is more than 21.1
# nats below the top can never win, so which tokens have probability zero would depend on the
# data (an unbounded privacy loss on an event of tiny probability). 64-bit uniforms reach
# [-3.79, 44.36] (x = 2^-64 at either end), a range of 48.15 nats, at ~1 ms per 49k-entry
# draw on CPU (BUILD_NOTES, "Sampling support").
GUMBEL_MODE = "highest"
GUMBEL_MIN = -math.log(-math.log(2.0**-64))          # -3.79
GUMBEL_MAX = -math.log(-math.log1p(-(2.0**-64)))     # 44.36
GUMBEL_RANGE = GUMBEL_MAX - GUMBEL_MIN               # 48.15
# Token utilities / tau are floored at (top - TOKEN_UTILITY_SPAN): a public constant below
# GUMBEL_RANGE, so every token of the vocabulary keeps a non-zero chance for any data.
TOKEN_UTILITY_SPAN = 40.0


def gumbel(key: jax.Array, shape) -> jax.Array:
  """[shape] float32 standard Gumbel noise over GUMBEL_MIN .. GUMBEL_MAX (see GUMBEL_MODE)."""
  return jax.random.gumbel(key, shape, jnp.float32, mode=GUMBEL_MODE)


# Gaussian mechanism.


def gaussian_mechanism(key: jax.Array, value: jax.Array, sigma) -> jax.Array:
  """value + N(0, sigma^2 I), elementwise.

  Privacy: for a query of L2 sensitivity s this is rho-zCDP with rho = s^2 / (2 sigma^2)
  (`gaussian_rho`). The noise multiplier in dp_accounting terms is sigma / s.

  Args:
    key: PRNG key.
    value: [...] float array, e.g. a [V] histogram or a [D] embedding sum.
    sigma: noise standard deviation (scalar).
  """
  value = jnp.asarray(value, jnp.float32)
  return value + sigma * jax.random.normal(key, value.shape, value.dtype)


gaussian_rho = costs.gaussian_rho   # zCDP cost of `gaussian_mechanism`
# zCDP cost of an epsilon-DP (bounded-range) exponential mechanism: the threshold, the tokens.
exponential_rho = costs.exponential_rho


# Threshold mechanism of DP-SynRAG step 3.


def threshold_sensitivity() -> float:
  """Sensitivity of the threshold utility -|#{i: s_i > theta} - k|: one document moves the count
  by at most 1 for every theta."""
  return 1.0


def threshold_intervals(scores: jax.Array, mask: jax.Array, k, epsilon):
  """The piecewise-constant log density of the threshold mechanism over [0, 1].

  Scores are clipped into [0, 1] and sorted; they cut [0, 1] into N + 1 intervals (some of
  width 0). On interval j the count #{i: mask_i and s_i > theta} is constant, so the density
  exp(-epsilon/2 |count - k|) is too; an interval's probability is that times its width.

  Args:
    scores: [N] float scores (cosine similarities).
    mask: [N] bool, True for real members of the cluster.
    k: target count.
    epsilon: privacy parameter (sensitivity 1).

  Returns:
    (edges [N + 2] increasing from 0 to 1, log_weights [N + 1] unnormalised log probabilities
    of the intervals (-inf for empty ones), counts [N + 1] int32).
  """
  scores = jnp.clip(jnp.asarray(scores, jnp.float32), 0.0, 1.0)
  mask = jnp.asarray(mask, bool)
  # Padded entries sit at 1.0, above every theta in [0, 1): they never count, and the intervals
  # they cut off are empty, so they carry no mass.
  values = jnp.where(mask, scores, 1.0)
  values, sorted_mask = jax.lax.sort((values, mask.astype(jnp.int32)), num_keys=1)
  zero, one = jnp.zeros((1,), jnp.float32), jnp.ones((1,), jnp.float32)
  edges = jnp.concatenate([zero, values, one])
  widths = jnp.diff(edges)
  # On interval j (between the j-th and (j+1)-th sorted value) exactly the real entries sorted
  # at positions >= j exceed theta.
  below = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(sorted_mask)])
  counts = jnp.sum(sorted_mask) - below
  utility = -jnp.abs(counts - k).astype(jnp.float32)
  log_widths = jnp.where(widths > 0, jnp.log(jnp.where(widths > 0, widths, 1.0)), -jnp.inf)
  return edges, log_widths + (epsilon / 2.0) * utility, counts


def sample_threshold(key: jax.Array, scores: jax.Array, mask: jax.Array, k, epsilon) -> jax.Array:
  """Draws theta in [0, 1] with density proportional to exp(-epsilon/2 |#{s > theta} - k|).

  The continuous exponential mechanism with utility -|#{i: mask_i and s_i > theta} - k| and
  sensitivity 1 (`threshold_sensitivity`): epsilon-DP, epsilon^2/8-zCDP. An interval is picked by
  Gumbel-max over `threshold_intervals`, then theta is uniform inside it. With an all-False
  mask (an empty cluster) theta is uniform on [0, 1]: the draw happens, and is paid for, either
  way, so whether a cluster is empty is not revealed by the ledger.

  Args:
    key: PRNG key.
    scores: [N] float scores; N static, padded entries masked out.
    mask: [N] bool.
    k: target count (int, may be traced).
    epsilon: privacy parameter.

  Returns:
    scalar float32 theta in [0, 1].
  """
  pick_key, within_key = jax.random.split(key)
  edges, log_weights, _ = threshold_intervals(scores, mask, k, epsilon)
  j = jnp.argmax(log_weights + gumbel(pick_key, log_weights.shape))
  u = jax.random.uniform(within_key, (), jnp.float32)
  return jnp.clip(edges[j] + u * (edges[j + 1] - edges[j]), 0.0, 1.0)


def select_above(scores: jax.Array, mask: jax.Array, theta) -> jax.Array:
  """[N] bool: real entries whose clipped score exceeds theta (S_r of step 3)."""
  scores = jnp.clip(jnp.asarray(scores, jnp.float32), 0.0, 1.0)
  return jnp.asarray(mask, bool) & (scores > theta)


# One private decoding step.


def floor_utilities(scaled: jax.Array, span: float = TOKEN_UTILITY_SPAN) -> jax.Array:
  """max(u, max(u) - span) over the last axis: [..., V] -> [..., V].

  Privacy: if each entry of u moves by at most c between neighbours (u_j(D') - u_j(D) in
  [-c, c], what the clipped sums give), then so does max(u), and so does every floored entry
  (a max of two such functions). The floored utility keeps the same bounded range, so the
  exponential mechanism over it costs exactly what the unfloored one does. The floor moves only
  tokens whose probability is below e^-span; with span < GUMBEL_RANGE every token can be drawn.
  """
  top = jnp.max(scaled, axis=-1, keepdims=True)
  return jnp.maximum(scaled, top - span)


def sample_token(key: jax.Array, summed_clipped: jax.Array, tau, vocab_mask=None) -> jax.Array:
  """Samples a token from softmax(floor_utilities(summed_clipped / tau)).

  With `summed_clipped` from `clipping.clipped_logit_sum(..., c)` this is the exponential
  mechanism with utility sensitivity c and epsilon = 2c / tau (`token_epsilon`): pure
  (2c/tau)-DP per token, and, since each token's utility change lies in [-c, c] (range 2c),
  (c/tau)^2 / 2-zCDP per token (`token_rho`), the figure Theorem 1 adds up. The floor (a
  public constant, `floor_utilities`) keeps that cost and keeps every token of the vocabulary
  within reach of the Gumbel noise, so the mechanism's support never depends on the data.

  Args:
    key: PRNG key.
    summed_clipped: [..., V] float sums of clipped logits.
    tau: temperature, > 0.
    vocab_mask: optional [V] bool of allowed tokens. It must be public (the same for any
      dataset), e.g. padding of the vocabulary to a multiple of 128.

  Returns:
    [...] int32 token ids.
  """
  logits = floor_utilities(jnp.asarray(summed_clipped, jnp.float32) / tau)
  if vocab_mask is not None:
    logits = jnp.where(jnp.asarray(vocab_mask, bool), logits, -jnp.inf)
  return jnp.argmax(logits + gumbel(key, logits.shape), axis=-1)


# A cluster's topic terms: exponential mechanisms over a public term list.


def select_top_terms(key: jax.Array, counts: jax.Array, epsilon, m: int) -> jax.Array:
  """m distinct terms, drawn by m peeled exponential mechanisms of utility `counts`.

  counts[j] is the number of the cluster's documents that contain term j, over a set of
  documents that adding or removing one document changes by that document at most (S_r given
  its threshold and noisy mean). Adding or removing it moves every count by 0 or 1, all in the
  same direction (the counts are
  monotone in the data), so exp(epsilon * count) (no factor 1/2) moves each term's
  log-probability, before normalising, by an amount within a range of epsilon: the mechanism
  is epsilon-bounded-range, epsilon-DP and epsilon^2/8-zCDP (Cesar & Rogers 2021), the
  `exponential` cost. One-shot Gumbel top-m is the same distribution as m exponential
  mechanisms run one after the other, each without the terms already drawn (Durfee & Rogers
  2019), so the m terms cost m * epsilon^2 / 8 (`costs.topic_terms_rho`). The utilities are
  floored TOKEN_UTILITY_SPAN below the top like the tokens' (`floor_utilities`; monotone
  changes stay monotone), so every term can be drawn whatever the data.

  Args:
    key: PRNG key.
    counts: [V] document counts (any numeric dtype), V >= m.
    epsilon: > 0.
    m: terms to draw (static).

  Returns:
    [m] int32 term indices, the most likely first (their order is part of the release).
  """
  if counts.shape[-1] < m:
    raise ValueError(f"Cannot draw {m} distinct terms from {counts.shape[-1]}.")
  utilities = floor_utilities(jnp.asarray(counts, jnp.float32) * epsilon)
  _, top = jax.lax.top_k(utilities + gumbel(key, utilities.shape), m)
  return top.astype(jnp.int32)


# The sparse vector test (AboveThreshold, Dwork & Roth 2014, Theorem 3.23) of the free public
# tokens: queries of sensitivity 1, a threshold noised once per instance, each query noised.


def laplace(key: jax.Array, shape, scale) -> jax.Array:
  """[shape] float32 Laplace(0, scale) noise."""
  return scale * jax.random.laplace(key, shape, jnp.float32)


def svt_noisy_threshold(key: jax.Array, threshold, epsilon) -> jax.Array:
  """threshold + Lap(2 / epsilon): the noisy threshold of one AboveThreshold instance."""
  return jnp.asarray(threshold, jnp.float32) + laplace(key, (), 2.0 / epsilon)


def svt_above(key: jax.Array, query, noisy_threshold, epsilon) -> jax.Array:
  """Whether query + Lap(4 / epsilon) >= noisy_threshold (scalar bool).

  Privacy: an AboveThreshold instance (one noisy threshold, then this test on adaptively chosen
  queries of sensitivity 1 until it first answers True) is epsilon-DP, hence epsilon^2/2-zCDP
  (`svt_rho`), however many False answers it gives. The query need not be monotone (the
  factor 4 rather than 2 in the query noise is what covers that).
  """
  return jnp.asarray(query, jnp.float32) + laplace(key, (), 4.0 / epsilon) >= noisy_threshold


svt_rho = costs.svt_rho   # zCDP cost of one AboveThreshold instance


def token_epsilon(c: float, tau: float) -> float:
  """Pure-DP epsilon of one `sample_token` step: 2c / tau."""
  return 2.0 * c / tau


def token_rho(c: float, tau: float) -> float:
  """zCDP rho of one `sample_token` step: (c/tau)^2 / 2 (= token_epsilon^2 / 8)."""
  return costs.tokens_rho(1, c, tau)

