"""Noisy keyword histogram, top-R keywords and soft clustering (DP-SynRAG steps 1-2).

Axis letters: N documents, K keywords per document, V public vocabulary, R top keywords.
"""

from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from dpsynrag_jax import privacy


@functools.partial(jax.jit, static_argnames=("vocab_size",))
def _noisy_histogram(key, keyword_ids, sigma_h, vocab_size):
  counts = privacy.keyword_histogram(keyword_ids, jnp.ones(keyword_ids.shape[0], bool),
                                     vocab_size)
  return privacy.gaussian_mechanism(key, counts, sigma_h)


def noisy_top_keywords(key: jax.Array, keyword_ids: np.ndarray, vocab_size: int, K: int,
                       sigma_h: float, R: int, ledger: privacy.PrivacyLedger) -> np.ndarray:
  """Releases the R words of V with the largest noisy document counts, most frequent first.

  The Gaussian mechanism over the whole vocabulary (L2 sensitivity sqrt(K)) is recorded in the
  ledger before it runs. Only the ranking leaves this function, never a count.

  Args:
    keyword_ids: [N, K] int32 ids into V, -1 for none.
    R: how many keywords to keep (<= V).

  Returns:
    [R] int32 word ids ordered by decreasing noisy count.
  """
  if keyword_ids.shape[1] != K:
    raise ValueError(f"keyword_ids has {keyword_ids.shape[1]} columns, expected K={K}.")
  if not 1 <= R <= vocab_size:
    raise ValueError(f"R must be in [1, {vocab_size}], got {R}.")
  ledger.record_histogram(K, sigma_h)
  noisy = _noisy_histogram(key, jnp.asarray(keyword_ids), jnp.float32(sigma_h),
                           vocab_size=vocab_size)
  # Stable order on ties so that the ranking is a function of the noisy counts alone.
  return np.argsort(-np.asarray(noisy), kind="stable")[:R].astype(np.int32)


def soft_clusters(keyword_ids: np.ndarray, top_words: Sequence[int], L: int) -> list[np.ndarray]:
  """Clusters C_1..C_R: documents holding w_r, each document in at most L clusters.

  Walks the keywords from the rarest (w_R) to the most frequent (w_1), so that documents are
  first claimed by their specific words; a document already in L clusters is skipped. A
  document's memberships depend only on its own keywords and the released ranking, which is
  what keeps the later per-cluster mechanisms' sensitivities per document.

  Returns:
    R arrays of document indices (ascending), C_r at position r.
  """
  if L < 1:
    raise ValueError(f"L must be >= 1, got {L}.")
  n = keyword_ids.shape[0]
  holders: dict[int, list[int]] = {int(w): [] for w in top_words}
  for doc in range(n):
    for w in set(int(x) for x in keyword_ids[doc] if x >= 0):
      if w in holders:
        holders[w].append(doc)
  memberships = np.zeros(n, np.int32)
  clusters: list[np.ndarray] = [np.zeros(0, np.int32)] * len(top_words)
  for r in range(len(top_words) - 1, -1, -1):
    docs = np.asarray(holders[int(top_words[r])], np.int32)
    docs = docs[memberships[docs] < L]
    memberships[docs] += 1
    clusters[r] = docs
  return clusters
