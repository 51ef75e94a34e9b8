"""The sums over private documents that Gaussian noise is added to, with their L2 sensitivities.

Axis letters: B documents (padded, with a row mask), K keywords per document, V public keyword
vocabulary, D embedding width.

Each function bounds one document's contribution by construction (deduplicated keywords, unit
embeddings), so the stated sensitivity holds for any input, not only for well-behaved callers.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp


def keyword_histogram_sensitivity(K: int) -> float:
  """L2 sensitivity of `keyword_histogram`: a document adds at most K distinct words, each by 1."""
  return math.sqrt(K)


def keyword_histogram(keyword_ids: jax.Array, row_mask: jax.Array, vocab_size: int) -> jax.Array:
  """Counts, per vocabulary word, the documents that hold it (DP-SynRAG step 1, before noise).

  Args:
    keyword_ids: [B, K] int ids into the public vocabulary; negative ids mean "no word" (an
      extracted word outside the vocabulary, or fewer than K words). Repeats within a row count
      once, so a row adds a 0/1 vector with at most K ones.
    row_mask: [B] bool, True for real documents.
    vocab_size: V (static).

  Returns:
    [V] float32 counts. L2 sensitivity sqrt(K) (`keyword_histogram_sensitivity`).
  """
  ids = jnp.asarray(keyword_ids, jnp.int32)
  valid = (ids >= 0) & (ids < vocab_size) & jnp.asarray(row_mask, bool)[:, None]
  ids = jnp.where(valid, ids, -1)
  # Deduplicate within a row: after sorting, a repeat equals its left neighbour.
  ids = jnp.sort(ids, axis=-1)
  repeat = jnp.concatenate([jnp.zeros_like(ids[:, :1], bool), ids[:, 1:] == ids[:, :-1]], axis=1)
  keep = (ids >= 0) & ~repeat
  # Invalid entries go to an extra bucket V that is dropped.
  flat = jnp.where(keep, ids, vocab_size).reshape(-1)
  return jnp.zeros((vocab_size + 1,), jnp.float32).at[flat].add(1.0)[:vocab_size]


def embedding_sum_sensitivity() -> float:
  """L2 sensitivity of `embedding_sum`: one document adds one unit (or zero) vector."""
  return 1.0


def embedding_sum(embeddings: jax.Array, row_mask: jax.Array) -> jax.Array:
  """Sum of L2-normalised embeddings of the real rows (mu_r of step 3, before noise).

  Not divided by the cluster size: a mean would make the sensitivity depend on |C_r|.

  Args:
    embeddings: [B, D] float; rows are normalised here (a zero row stays zero).
    row_mask: [B] bool.

  Returns:
    [D] float32. L2 sensitivity 1 (`embedding_sum_sensitivity`).
  """
  x = jnp.asarray(embeddings, jnp.float32)
  norm = jnp.linalg.norm(x, axis=-1, keepdims=True)
  unit = x / jnp.where(norm > 0, norm, 1.0)
  # Renormalising cannot push a norm above 1 by more than rounding; clip the norm so the
  # sensitivity bound is exact, not approximately so.
  unit_norm = jnp.linalg.norm(unit, axis=-1, keepdims=True)
  unit = unit / jnp.maximum(unit_norm, 1.0)
  return jnp.sum(jnp.where(jnp.asarray(row_mask, bool)[:, None], unit, 0.0), axis=0)
