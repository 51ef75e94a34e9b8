"""Statistical tests of the mechanisms' output laws (fixed seeds, so deterministic)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from dpsynrag_jax import privacy

SIGMA_H = math.sqrt(10 / (2 * 0.1))  # the paper's calibrated histogram noise


def test_gaussian_ks_accepts_calibrated_sigma_and_rejects_others():
  cal = privacy.calibrate(10.0, 1e-3)
  assert cal.sigma_h == pytest.approx(SIGMA_H)
  value = jnp.linspace(-50.0, 50.0, 20000)
  noisy = jax.jit(privacy.gaussian_mechanism)(jax.random.PRNGKey(0), value, cal.sigma_h)
  noise = np.asarray(noisy - value, np.float64)
  assert stats.kstest(noise, "norm", args=(0.0, cal.sigma_h)).pvalue > 1e-3
  for wrong in (2 / 3 * cal.sigma_h, 3 / 2 * cal.sigma_h):
    assert stats.kstest(noise, "norm", args=(0.0, wrong)).pvalue < 1e-6


def test_gaussian_rho():
  assert privacy.gaussian_rho(math.sqrt(10), SIGMA_H) == pytest.approx(0.1)
  assert privacy.gaussian_rho(1.0, 1 / math.sqrt(2 * 0.009)) == pytest.approx(0.009)


def chi_square_pvalue(samples, probs):
  counts = np.bincount(np.asarray(samples), minlength=len(probs))
  keep = np.asarray(probs) > 0
  assert counts[~keep].sum() == 0, "a zero-probability candidate was sampled"
  probs = np.asarray(probs, np.float64)[keep]
  return stats.chisquare(counts[keep], probs / probs.sum() * counts.sum()).pvalue


# One compiled sampler for every threshold test below (compiling is the slow part on CPU).
N_SCORES, N_DRAWS = 256, 20000


@jax.jit
def many_thresholds(key, scores, mask, k, eps):
  """N_DRAWS thresholds for [N_SCORES] scores (shorter inputs are padded and masked)."""
  pad = N_SCORES - scores.shape[0]
  scores = jnp.pad(jnp.asarray(scores, jnp.float32), (0, pad))
  mask = jnp.pad(jnp.asarray(mask, bool), (0, pad))
  return jax.vmap(privacy.sample_threshold, (0, None, None, None, None))(
      jax.random.split(key, N_DRAWS), scores, mask, k, eps)


intervals = jax.jit(privacy.threshold_intervals)


def interval_probs(scores, mask, k, eps):
  edges, log_w, counts = intervals(scores, mask, k, eps)
  log_w = np.asarray(log_w, np.float64)
  return np.asarray(edges), np.exp(log_w - log_w.max()), np.asarray(counts)


def padded(x, fill):
  return np.concatenate([x, np.full(N_SCORES - len(x), fill, x.dtype)])


def test_threshold_law_matches_piecewise_density():
  rng = np.random.default_rng(0)
  scores = padded(np.clip(rng.normal(0.5, 0.2, 24), -0.1, 1.1).astype(np.float32), 0.3)
  mask = np.arange(N_SCORES) < 20  # the rest is padding
  thetas = np.asarray(many_thresholds(jax.random.PRNGKey(3), scores, mask, 8, 1.0))
  assert np.all((thetas >= 0) & (thetas <= 1))
  edges, probs, _ = interval_probs(scores, mask, 8, 1.0)
  # Interval j is (edges[j], edges[j+1]); ties make empty intervals that searchsorted skips.
  which = np.searchsorted(edges, thetas, side="right") - 1
  assert chi_square_pvalue(np.minimum(which, len(probs) - 1), probs) > 1e-3
  # Uniform within intervals: positions inside the most likely interval.
  j = int(np.argmax(probs))
  inside = thetas[which == j]
  rel = (inside - edges[j]) / (edges[j + 1] - edges[j])
  assert stats.kstest(rel, "uniform").pvalue > 1e-3


def test_threshold_count_lands_near_k():
  rng = np.random.default_rng(1)
  scores = rng.uniform(0, 1, N_SCORES).astype(np.float32)
  mask = np.arange(N_SCORES) < 200
  k = 80
  thetas = np.asarray(many_thresholds(jax.random.PRNGKey(4), scores, mask, k, 0.4))
  counts = (mask[None] & (scores[None] > thetas[:, None])).sum(axis=1)
  near = np.mean(np.abs(counts - k) <= 5)
  uniform_thetas = rng.uniform(0, 1, N_DRAWS)
  uniform_near = np.mean(
      np.abs((mask[None] & (scores[None] > uniform_thetas[:, None])).sum(1) - k) <= 5)
  assert near > 0.5 and near > 5 * uniform_near, (near, uniform_near)
  # select_above agrees with the count.
  selected = privacy.select_above(scores, mask, thetas[0])
  assert int(selected.sum()) == counts[0]
  assert not np.any(np.asarray(selected)[~mask])


def test_threshold_on_empty_cluster_is_uniform():
  scores = np.linspace(0, 1, N_SCORES).astype(np.float32)
  empty = np.zeros(N_SCORES, bool)
  thetas = np.asarray(many_thresholds(jax.random.PRNGKey(5), scores, empty, 5, 0.4))
  assert np.all(np.isfinite(thetas))
  assert stats.kstest(thetas, "uniform").pvalue > 1e-3
  assert not np.any(np.asarray(privacy.select_above(scores, empty, 0.3)))


def test_threshold_padding_does_not_change_the_law():
  scores = np.array([0.2, 0.9, 0.5, 0.55, 1.3, -0.2], np.float32)
  with_pad = padded(scores, 0.4)
  mask = np.arange(N_SCORES) < 6

  def cdf(scores, mask, x):
    edges, probs, _ = interval_probs(scores, mask, 3, 2.0)
    widths = np.diff(edges)
    covered = np.clip((x[:, None] - edges[None, :-1]) / np.where(widths > 0, widths, 1), 0, 1)
    return covered @ probs / probs.sum()

  x = np.linspace(0, 1, 23)
  np.testing.assert_allclose(cdf(with_pad, mask, x), cdf(scores, np.ones(6, bool), x),
                             atol=1e-6)


def test_threshold_compiles_once_for_any_k_and_eps():
  traces = []

  @jax.jit
  def f(key, scores, mask, k, eps):
    traces.append(1)
    return privacy.sample_threshold(key, scores, mask, k, eps)

  scores = jnp.linspace(0, 1, 32)
  for k, eps, m in [(3, 0.4, 10), (10, 1.0, 32), (0, 0.1, 0)]:
    f(jax.random.PRNGKey(k), scores, jnp.arange(32) < m, k, eps)
  assert len(traces) == 1


def test_sample_token_law_and_vocab_mask():
  summed = np.array([0.3, -0.2, 0.0, 0.45, -0.5, 0.1], np.float32)
  tau, n = 0.25, 60000
  draw = jax.jit(lambda key, s, t, m: privacy.sample_token(key, s, t, m))
  ids = draw(jax.random.PRNGKey(6), jnp.broadcast_to(summed, (n, 6)), tau, np.ones(6, bool))
  assert chi_square_pvalue(ids, np.exp(summed / tau)) > 1e-3
  vocab_mask = np.array([True, True, False, True, True, True])
  ids = draw(jax.random.PRNGKey(7), jnp.broadcast_to(summed, (n, 6)), tau, vocab_mask)
  assert chi_square_pvalue(ids, np.exp(summed / tau) * vocab_mask) > 1e-3
  # The EM view: sampling softmax(u / tau) is the exponential mechanism with epsilon = 2c/tau and
  # sensitivity c; both views agree on the cost.
  c = 0.1
  assert privacy.token_epsilon(c, tau) == pytest.approx(0.8)
  assert privacy.token_rho(c, tau) == pytest.approx(privacy.token_epsilon(c, tau)**2 / 8)
  assert privacy.token_rho(c, tau) == pytest.approx(privacy.exponential_rho(2 * c / tau))
  assert privacy.exponential_rho(0.4) == pytest.approx(0.02)


def test_token_utilities_are_floored_within_the_noise_range_with_the_same_sensitivity():
  from dpsynrag_jax.privacy import mechanisms
  assert mechanisms.TOKEN_UTILITY_SPAN < mechanisms.GUMBEL_RANGE
  u = jnp.array([0.0, -5.0, -39.0, -41.0, -1e6, -jnp.inf])
  floored = np.asarray(mechanisms.floor_utilities(u))
  np.testing.assert_allclose(floored, [0.0, -5.0, -39.0, -40.0, -40.0, -40.0])
  # Neighbours: every entry moves by at most c; so does every floored entry.
  rng = np.random.default_rng(0)
  c = 0.3
  for _ in range(200):
    u = rng.normal(0, 20, 64).astype(np.float32)
    v = u + rng.uniform(-c, c, 64).astype(np.float32)
    diff = np.asarray(mechanisms.floor_utilities(jnp.asarray(v)) -
                      mechanisms.floor_utilities(jnp.asarray(u)))
    assert np.all(np.abs(diff) <= c + 1e-4)


def test_gumbel_noise_reaches_past_the_float32_default():
  """The default float32 Gumbel stops at 16.64 (-log(2^-24)): a token 21 nats below the top
  could never be drawn. The sampler's noise goes past that (fixed key: deterministic)."""
  from dpsynrag_jax.privacy import mechanisms
  default_max = -np.log(-np.log1p(-2.0**-24))
  draw = jax.jit(lambda k: jnp.max(mechanisms.gumbel(k, (1 << 22,))))
  best = max(float(draw(jax.random.PRNGKey(i))) for i in range(64))   # 2^28 draws
  assert best > default_max
  assert mechanisms.GUMBEL_MAX > 44 and mechanisms.GUMBEL_RANGE > 48
