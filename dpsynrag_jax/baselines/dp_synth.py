"""DP-Synth (Amin et al. 2024): private prediction over disjoint batches, no retrieval structure.

Documents are split into disjoint batches of about `batch_size`; each batch is rephrased into
one synthetic text by the same clipped-sum private decode as DP-SynRAG, then self-filtered and
indexed. Every document is in exactly one batch, so by parallel composition the run costs one
batch's T tokens: rho = T (c/tau)^2 / 2, with c set to spend eps_total (no histogram, no
re-ranking, L = 1).

A document's batch is a keyed hash of its text, so it depends on the document alone (the
partition of the others does not move when one is added or removed). The number of batches,
ceil(N / batch_size), treats the corpus size N as public, as the original method does.
"""

from __future__ import annotations

import hashlib
import math

import jax
import numpy as np
import tqdm

from dpsynrag_jax import privacy
from dpsynrag_jax.baselines.base import RetrievalMethod, Retriever
from dpsynrag_jax.data.tasks import Task
from dpsynrag_jax.synrag import self_filter
from dpsynrag_jax.synrag.private_prediction import PrivatePredictor, decode_many


def batch_of(text: str, seed: int, num_batches: int) -> int:
  """A document's batch: a keyed hash of its text (independent of every other document)."""
  digest = hashlib.sha256(f"{seed}:{text}".encode("utf-8")).digest()
  return int.from_bytes(digest[:8], "little") % num_batches


class DPSynth(RetrievalMethod):
  """Args:
    task: documents, self-filter prompt and top_k.
    epsilon, delta: the whole run's budget.
    T, tau: private tokens per synthetic text and sampling temperature.
    batch_size: documents per batch (100 in the paper).
  """
  name = "DP-Synth"

  def __init__(self, lm, encoder, task: Task, *, epsilon: float = 10.0, delta: float = 1e-3,
               T: int = 70, tau: float = 1.0, batch_size: int = 100, seed: int = 0,
               self_filter_enabled: bool = True, max_new_tokens: int = 48):
    self.lm, self.encoder, self.task = lm, encoder, task
    self.T, self.tau, self.batch_size, self.seed = T, tau, batch_size, seed
    self.self_filter_enabled = self_filter_enabled
    self.top_k, self.max_new_tokens = task.top_k, max_new_tokens
    rho = privacy.eps_to_zcdp(epsilon, delta)
    self.c = tau * math.sqrt(2.0 * rho / T)
    self.ledger = privacy.PrivacyLedger(epsilon, delta, max_clusters_per_document=1)
    self.synthetic_texts: list[str] = []

  def build(self) -> None:
    docs = self.task.documents
    num_batches = max(1, math.ceil(len(docs) / self.batch_size))
    batches: dict[int, list[str]] = {b: [] for b in range(num_batches)}
    for d in docs:
      batches[batch_of(d, self.seed, num_batches)].append(d)
    predictor = PrivatePredictor(self.lm, c=self.c, tau=self.tau, T=self.T)
    suffixes = {b: predictor.suffixes(ds) for b, ds in batches.items()}
    key = jax.random.fold_in(jax.random.PRNGKey(self.seed), 3)

    def charge(group):
      for b in group:
        self.ledger.record_tokens(b, self.T, self.c, self.tau)

    with tqdm.tqdm(total=num_batches, desc="DP-Synth decode", unit="batch") as bar:
      tokens = decode_many(predictor, suffixes, lambda b: jax.random.fold_in(key, b),
                           before_group=charge, progress=bar)
    texts = [predictor.text(tokens[b]) for b in range(num_batches)]
    keep = np.array([bool(t) for t in texts])
    prompt = self.task.self_filter_prompt
    if self.self_filter_enabled and prompt:
      keep &= self_filter.self_filter(self.lm, texts,
                                      self_filter.FILTER_PROMPTS.get(prompt, prompt))
    self.synthetic_texts = [t for t, k in zip(texts, keep) if k]
    self.retriever = Retriever(self.encoder, self.synthetic_texts)

  @property
  def epsilon(self) -> float:
    return self.ledger.spent_epsilon()
