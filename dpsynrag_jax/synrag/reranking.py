"""Embedding re-ranking of a cluster (DP-SynRAG step 3).

mu_r = sum of the members' unit embeddings + N(0, sigma_mu^2 I)   (L2 sensitivity 1)
s_ir = cosine(E(d_i), mu_r)
theta ~ exponential mechanism with utility -|#{i: s_ir > theta} - k|   (sensitivity 1)
S_r  = {d_i in C_r : s_ir > theta}

Both releases are recorded in the ledger before they run. The mechanisms run for every cluster,
empty ones included, so neither the ledger nor the run's control flow says which are empty.
Axis letters: M members (padded to a bucket), D embedding width.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from dpsynrag_jax import privacy

MEMBER_BUCKET = 64


def _bucket(n: int) -> int:
  return max(MEMBER_BUCKET, -(-n // MEMBER_BUCKET) * MEMBER_BUCKET)


@jax.jit
def _rerank(key, embeddings, mask, sigma_mu, eps_theta, k):
  """embeddings [M, D] unit rows, mask [M] -> keep [M] bool (S_r within the padded members)."""
  mean_key, threshold_key = jax.random.split(key)
  mu = privacy.gaussian_mechanism(mean_key, privacy.embedding_sum(embeddings, mask), sigma_mu)
  mu_unit = mu / jnp.maximum(jnp.linalg.norm(mu), 1e-12)
  scores = embeddings @ mu_unit
  theta = privacy.sample_threshold(threshold_key, scores, mask, k, eps_theta)
  return privacy.select_above(scores, mask, theta)


def select_members(key: jax.Array, embeddings: np.ndarray, members: np.ndarray, *,
                   sigma_mu: float, eps_theta: float, k: int, cluster: int,
                   ledger: privacy.PrivacyLedger) -> np.ndarray:
  """S_r: the members of C_r whose embedding is close to the cluster's noisy direction.

  Args:
    embeddings: [N, D] unit-norm embeddings of all documents.
    members: indices of C_r (any length, possibly 0).
    cluster: r, the public cluster index the ledger entries carry.

  Returns:
    indices of S_r (a subset of members, ascending).
  """
  ledger.record_cluster_mean(cluster, sigma_mu)
  ledger.record_threshold(cluster, eps_theta)
  m = _bucket(len(members))
  padded = np.zeros((m, embeddings.shape[1]), np.float32)
  padded[:len(members)] = embeddings[members]
  mask = np.arange(m) < len(members)
  keep = _rerank(key, jnp.asarray(padded), jnp.asarray(mask), jnp.float32(sigma_mu),
                 jnp.float32(eps_theta), jnp.int32(k))
  return np.asarray(members)[np.asarray(keep)[:len(members)]]
