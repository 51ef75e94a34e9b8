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


def soft_clusters(keyword_ids: np.ndarray, top_words: Sequence[int], L: int,
                  groups: Sequence[Sequence[int]] | None = None) -> list[np.ndarray]:
  """Clusters C_1..C_R: documents holding w_r, each document in at most L clusters.

  Walks the keywords from the rarest (w_R) to the most frequent (w_1), so that documents are
  first claimed by their specific words; a document already in L clusters is skipped. A
  document's memberships depend only on its own keywords and the released ranking, which is
  what keeps the later per-cluster mechanisms' sensitivities per document.

  groups: optional word-id groups, one per cluster in rank order (see group_synonyms): cluster r
    then holds the documents with ANY word of groups[r]. Default: [[w] for w in top_words].

  Returns:
    one array of document indices (ascending) per cluster, C_r at position r.
  """
  if L < 1:
    raise ValueError(f"L must be >= 1, got {L}.")
  groups = [[int(w)] for w in top_words] if groups is None else [
      [int(w) for w in g] for g in groups]
  n = keyword_ids.shape[0]
  group_of: dict[int, list[int]] = {}
  for r, group in enumerate(groups):
    for w in group:
      group_of.setdefault(w, []).append(r)
  holders: list[set[int]] = [set() for _ in groups]
  for doc in range(n):
    for w in set(int(x) for x in keyword_ids[doc] if x >= 0):
      for r in group_of.get(w, ()):
        holders[r].add(doc)
  memberships = np.zeros(n, np.int32)
  clusters: list[np.ndarray] = [np.zeros(0, np.int32)] * len(groups)
  for r in range(len(groups) - 1, -1, -1):
    docs = np.asarray(sorted(holders[r]), np.int32)
    docs = docs[memberships[docs] < L]
    memberships[docs] += 1
    clusters[r] = docs
  return clusters


def group_synonyms(words: Sequence[str], embeddings: np.ndarray,
                   threshold: float) -> list[list[int]]:
  """Groups released keywords whose public embeddings are close (synonyms, surface forms).

  Greedy in rank order: each word joins the first group whose leader (its first, most frequent
  word) has cosine >= threshold with it, else leads a new group. Inputs are the released top-R
  words and a public encoder's embeddings of them, so this is post-processing: no budget.

  Args:
    words: the top-R words, most frequent first (only their count is used here).
    embeddings: [R, D] unit-norm embeddings of `words`.
    threshold: cosine similarity to join a group, in (0, 1].

  Returns:
    groups of indices into `words`, in the order of their leaders' ranks.
  """
  if not 0 < threshold <= 1:
    raise ValueError(f"threshold must be in (0, 1], got {threshold}.")
  if len(words) != embeddings.shape[0]:
    raise ValueError("words and embeddings must have the same length.")
  groups: list[list[int]] = []
  for i in range(len(words)):
    leaders = np.asarray([g[0] for g in groups], np.int64)
    if len(leaders):
      sims = embeddings[leaders] @ embeddings[i]
      best = int(np.argmax(sims))
      if sims[best] >= threshold:
        groups[best].append(i)
        continue
    groups.append([i])
  return groups
