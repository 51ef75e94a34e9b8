"""Empirical sensitivity: remove (or add) one document and measure how far each query moves.

Neighbours are built the way the pipeline builds them: the same padded batch with one row's mask
flipped, so the test also covers the masking.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpsynrag_jax import privacy

B, V, K, D = 12, 64, 10, 48
TRIALS = 64


def neighbour_masks(row_mask):
  """[B, B] masks: row j of the result is `row_mask` with document j flipped (removed if it was
  real, added if it was padding)."""
  return row_mask[None, :] ^ jnp.eye(row_mask.shape[0], dtype=bool)


def random_logits(rng):
  logits = rng.normal(0, 4, (TRIALS, B, V)).astype(np.float32)
  logits[::4, :, V // 2:] = -np.inf  # masked vocabulary
  logits[1::4, 0] = -np.inf  # one document puts +big on a token, -inf on the rest
  logits[1::4, 0, 3] = 1e30
  logits[2::4, 1:4] = 5.0  # tied rows
  return logits


@functools.partial(jax.jit, static_argnames=("method",))
def logit_sum_changes(logits, row_mask, c, method):
  """[TRIALS, B, V]: change of the clipped sum when each document is flipped."""

  def one(logits):
    base = privacy.clipped_logit_sum(logits, row_mask, c, method=method)
    flipped = jax.vmap(lambda m: privacy.clipped_logit_sum(logits, m, c, method=method))(
        neighbour_masks(row_mask))
    return flipped - base

  return jax.vmap(one)(logits)


@pytest.mark.parametrize("method", ["grislain", "clamp"])
def test_clipped_logit_sum_moves_at_most_c(method):
  c = 0.3
  logits = random_logits(np.random.default_rng(0))
  row_mask = jnp.arange(B) < 9  # three padded rows: flipping them is the "add one" neighbour
  change = np.asarray(logit_sum_changes(logits, row_mask, c, method))
  bound = privacy.clipped_logit_sum_sensitivity(c)
  assert np.abs(change).max() <= bound * (1 + 1e-5)
  # The change of all tokens lies in a box of width 2c (what the token zCDP bound uses).
  assert (change.max(-1) - change.min(-1)).max() <= 2 * bound * (1 + 1e-5)
  # The bound is attained by the extreme document, so it is not loose.
  assert np.abs(change[1::4, 0]).max() >= 0.99 * bound


@jax.jit
def histogram_changes(ids, row_mask):
  base = privacy.keyword_histogram(ids, row_mask, V)
  return jax.vmap(lambda m: privacy.keyword_histogram(ids, m, V))(neighbour_masks(row_mask)) - base


def test_keyword_histogram_moves_at_most_sqrt_k():
  rng = np.random.default_rng(1)
  bound = privacy.keyword_histogram_sensitivity(K)
  row_mask = jnp.arange(B) < 10
  worst = 0.0
  for trial in range(5):
    ids = rng.integers(-3, V + 3, (B, K))  # out-of-vocabulary ids on both sides
    ids[0] = rng.permutation(V)[:K]  # a document with K distinct vocabulary words
    ids[1] = 7  # one word, repeated: counts once
    ids[11] = rng.permutation(V)[:K]  # a padded row that "add one" brings in
    change = np.asarray(histogram_changes(ids, row_mask))
    norms = np.linalg.norm(change, axis=-1)
    assert norms.max() <= bound + 1e-6
    assert norms[0] == pytest.approx(bound) and norms[11] == pytest.approx(bound)
    assert norms[1] == pytest.approx(1.0)
    worst = max(worst, norms.max())
  assert worst == pytest.approx(math.sqrt(K))
  hist = privacy.keyword_histogram(np.array([[1, 1, 2, -1], [2, 3, 99, 2]]), np.ones(2, bool), 5)
  np.testing.assert_array_equal(np.asarray(hist), [0, 1, 2, 1, 0])


@jax.jit
def embedding_changes(x, row_mask):
  base = privacy.embedding_sum(x, row_mask)
  return jax.vmap(lambda m: privacy.embedding_sum(x, m))(neighbour_masks(row_mask)) - base


def test_embedding_sum_moves_at_most_one():
  rng = np.random.default_rng(2)
  row_mask = jnp.arange(B) < 8
  for scale in (1e-20, 1e-3, 1.0, 1e15):
    x = (rng.normal(0, 1, (B, D)) * scale).astype(np.float32)
    x[2] = 0.0  # a zero embedding adds nothing
    norms = np.linalg.norm(np.asarray(embedding_changes(x, row_mask)), axis=-1)
    assert norms.max() <= privacy.embedding_sum_sensitivity() + 1e-6
    assert norms[2] <= 1e-5  # zero up to summation order (vmapped vs not)
    if scale >= 1e-3:  # normal floats normalise to unit length exactly
      np.testing.assert_allclose(np.delete(norms, 2), 1.0, atol=1e-5)


def test_threshold_count_moves_at_most_one():
  rng = np.random.default_rng(3)
  scores = rng.uniform(-0.2, 1.2, B).astype(np.float32)
  thetas = np.linspace(0, 1, 1001)
  row_mask = np.arange(B) < 9
  def count(mask):
    return (mask[None] & (np.clip(scores, 0, 1)[None] > thetas[:, None])).sum(1)

  base = count(row_mask)
  for j in range(B):
    flipped = row_mask.copy()
    flipped[j] = ~flipped[j]
    assert np.abs(count(flipped) - base).max() <= privacy.threshold_sensitivity()
