"""Differentially private partition selection: which terms a private corpus holds, by Gaussian
thresholding (the discovered topic terms of synrag.discovery).

Each document proposes at most `m` distinct terms (the l0 bound; a rule that reads that
document alone picks them) and counts each once (the l_inf bound 1). The mechanism adds
N(0, sigma^2) to the document count of every term some document proposes and releases the
terms whose noisy count exceeds `threshold`; the counts themselves are not released.

Why Gaussian thresholding (Gopi et al. 2020, "Differentially private set union", section 3;
Desfontaines, Voss, Gipson & Mandayam 2022, "Differentially private partition selection") and
not the optimal policy of Desfontaines et al.: that policy is optimal for m = 1, and a document
here proposes several terms (a disease, its symptoms, its treatment); with m > 1 the policy's
guarantee composes per term (m-fold), while the Gaussian's L2 sensitivity grows as sqrt(m), and
its cost is zCDP, so both accountants compose it with the rest of the build exactly.

Guarantee (add or remove one document x). The terms that some other document also proposes
get counts that move by 1 each, at most m of them: the Gaussian mechanism of L2 sensitivity
sqrt(m), rho = m / (2 sigma^2) (`costs.partition_selection_rho`). Terms only x proposes have
count 1 with x and do not exist without it; one of them is released with probability at most
`costs.partition_selection_delta` = 1 - Phi((threshold - 1) / sigma)^m. Outside that event the
output is a post-processing of the Gaussian mechanism, so the release is (delta_t, rho)-
approximate zCDP and its delta_t adds to the run's delta (the ledger subtracts it from the
budget's delta before converting rho). `threshold_for` chooses the threshold that spends a
given delta_t.

The released set is ordered alphabetically (never by count), so nothing but membership depends
on the counts. The noise of term j is the j-th draw of one key over the terms sorted
alphabetically, so a resumed build redraws the same set.
"""

from __future__ import annotations

from typing import Iterable

import jax
import jax.numpy as jnp
import numpy as np

from dpsynrag_jax.privacy import costs


def threshold_for(sigma: float, m: int, delta: float) -> float:
  """The threshold at which selection with noise sigma and l0 bound m spends delta."""
  return costs.partition_selection_threshold(m, sigma, delta)


def document_counts(proposals: Iterable[Iterable[str]], m: int) -> dict[str, int]:
  """term -> the number of documents proposing it. Each document's proposals must be at most m
  distinct terms (ValueError otherwise: the guarantee rests on that bound)."""
  counts: dict[str, int] = {}
  for i, terms in enumerate(proposals):
    terms = list(terms)
    if len(set(terms)) != len(terms) or len(terms) > m:
      raise ValueError(f"Document {i} proposes {len(terms)} terms ({len(set(terms))} "
                       f"distinct); partition selection needs at most m = {m} distinct ones.")
    for t in terms:
      counts[t] = counts.get(t, 0) + 1
  return counts


def select_partitions(key: jax.Array, counts: dict[str, int], sigma: float,
                      threshold: float) -> list[str]:
  """The terms whose count + N(0, sigma^2) exceeds `threshold`, alphabetically.

  Charge the ledger (kind 'partition_selection') before calling.

  Args:
    key: PRNG key of this release.
    counts: term -> document count (`document_counts`), over the terms some document proposes.
    sigma: noise standard deviation.
    threshold: release threshold (`threshold_for`).
  """
  terms = sorted(counts)
  if not terms:
    return []
  values = np.asarray([counts[t] for t in terms], np.float32)
  noisy = np.asarray(values + sigma * jax.random.normal(key, values.shape, jnp.float32))
  return [t for t, v in zip(terms, noisy) if v > threshold]
