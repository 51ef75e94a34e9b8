"""Privacy audits: the claimed epsilon against what two neighbouring inputs actually reveal.

One token step (clip -> masked sum -> softmax(/tau) -> sample) is audited twice: exactly, from
the output probabilities of many random neighbour pairs, and empirically, from samples with
Clopper-Pearson bounds, the way a black-box auditor would. The threshold mechanism gets the exact
audit. Each audit also checks that the bound is nearly attained: a mechanism that ignored the
data would pass "audited <= claimed" trivially.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special
from scipy import stats

from dpsynrag_jax import privacy

C, TAU = 0.25, 0.5
CLAIMED = privacy.token_epsilon(C, TAU)  # 2c / tau = 1.0
B, V = 8, 8
METHODS = ("grislain", "clamp")


def extreme_cluster(others=3):
  """[B, V] logits: `others` documents favour token 1, document 0 puts everything on token 0
  (-inf elsewhere), the rest is padding (NaN, to prove it is ignored)."""
  logits = np.full((B, V), np.nan, np.float32)
  logits[1:1 + others] = 0.0
  logits[1:1 + others, 1] = 10.0
  logits[0] = -np.inf
  logits[0, 0] = 30.0
  with_doc = np.arange(B) < 1 + others
  without_doc = with_doc & (np.arange(B) > 0)
  return logits, with_doc, without_doc


@functools.partial(jax.jit, static_argnames=("method",))
def token_log_probs(logits, row_mask, method):
  summed = privacy.clipped_logit_sum(logits, row_mask, C, method=method)
  return jax.nn.log_softmax(summed / TAU)


@functools.partial(jax.jit, static_argnames=("method", "n"))
def sample_tokens(key, logits, row_mask, method, n):
  summed = privacy.clipped_logit_sum(logits, row_mask, C, method=method)
  return privacy.sample_token(key, jnp.broadcast_to(summed, (n, V)), TAU)


@pytest.mark.parametrize("method", METHODS)
def test_exact_token_audit_on_random_neighbours(method):
  rng = np.random.default_rng(0)
  worst = 0.0
  batched = jax.vmap(token_log_probs, (0, 0, None))
  for _ in range(4):
    logits = rng.normal(0, 5, (256, B, V)).astype(np.float32)
    logits[::3, :, 5:] = -np.inf
    logits[1::3, 0] = -np.inf
    logits[1::3, 0, 0] = 40.0
    sizes = rng.integers(1, B + 1, 256)
    with_doc = np.arange(B)[None] < sizes[:, None]
    without_doc = with_doc & (np.arange(B)[None] > 0)
    gap = np.abs(np.asarray(batched(logits, with_doc, method))
                 - np.asarray(batched(logits, without_doc, method)))
    worst = max(worst, gap.max())
  assert worst <= CLAIMED * (1 + 1e-5)
  # Many documents on token 1 and one extreme document on token 0 get close to the bound.
  logits, with_doc, without_doc = extreme_cluster(others=7)
  gap = np.abs(np.asarray(token_log_probs(logits, with_doc, method))
               - np.asarray(token_log_probs(logits, without_doc, method)))
  assert CLAIMED * 0.9 <= gap.max() <= CLAIMED * (1 + 1e-5)


def clopper_pearson(k, n, beta):
  """Two one-sided (1 - beta) bounds on a binomial proportion."""
  lo = stats.beta.ppf(beta, k, n - k + 1) if k > 0 else 0.0
  hi = stats.beta.ppf(1 - beta, k + 1, n - k) if k < n else 1.0
  return lo, hi


def audited_epsilon(a, b, beta=1e-3):
  """Largest log(P_a(E) lower bound / P_b(E) upper bound) over the events E = {token = t} and
  their complements, both directions: a high-confidence lower bound on the true epsilon."""
  n = len(a)
  ca, cb = np.bincount(a, minlength=V), np.bincount(b, minlength=V)
  best = 0.0
  for counts_x, counts_y in ((ca, cb), (cb, ca)):
    for t in range(V):
      for kx, ky in ((counts_x[t], counts_y[t]), (n - counts_x[t], n - counts_y[t])):
        lo, _ = clopper_pearson(kx, n, beta)
        _, hi = clopper_pearson(ky, n, beta)
        if lo > 0:
          best = max(best, np.log(lo / hi))
  return best


@pytest.mark.parametrize("method", METHODS)
def test_sampled_token_audit(method):
  n = 200_000
  logits, with_doc, without_doc = extreme_cluster(others=3)
  key_a, key_b = jax.random.split(jax.random.PRNGKey(0))
  a = np.asarray(sample_tokens(key_a, logits, with_doc, method, n))
  b = np.asarray(sample_tokens(key_b, logits, without_doc, method, n))
  eps_lower = audited_epsilon(a, b)
  exact = np.abs(np.asarray(token_log_probs(logits, with_doc, method))
                 - np.asarray(token_log_probs(logits, without_doc, method))).max()
  assert eps_lower <= CLAIMED
  assert eps_lower <= exact  # a lower bound on the truth, not only on the claim
  # The differing document is visible in the output, and the audit sees most of the budget.
  table = np.stack([np.bincount(a, minlength=V), np.bincount(b, minlength=V)])
  assert stats.chi2_contingency(table[:, table.sum(0) > 0]).pvalue < 1e-10
  assert eps_lower >= 0.75 * CLAIMED, (eps_lower, exact)


def threshold_log_density(scores, mask, k, eps, thetas):
  edges, log_w, _ = privacy.threshold_intervals(scores, mask, k, eps)
  log_z = special.logsumexp(np.asarray(log_w, np.float64))
  counts = (mask[None] & (np.clip(scores, 0, 1)[None] > thetas[:, None])).sum(1)
  return -eps / 2 * np.abs(counts - k) - log_z


def test_exact_threshold_audit():
  rng = np.random.default_rng(1)
  eps = 0.4
  thetas = rng.uniform(0, 1, 2000)
  worst = 0.0
  for trial in range(40):
    n = 24
    scores = rng.uniform(-0.1, 1.1, n).astype(np.float32)
    if trial % 2:  # a bunched cluster: small |C| changes shift the normaliser most
      scores = rng.normal(0.6, 0.02, n).astype(np.float32)
    mask = np.arange(n) < rng.integers(1, n)
    k = int(rng.integers(0, n))
    base = threshold_log_density(scores, mask, k, eps, thetas)
    for j in range(n):
      other = mask.copy()
      other[j] = ~other[j]
      gap = np.abs(threshold_log_density(scores, other, k, eps, thetas) - base).max()
      worst = max(worst, gap)
  assert worst <= eps * (1 + 1e-5)
  assert worst >= 0.5 * eps
