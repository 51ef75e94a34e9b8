"""The private token mechanism: one token for a whole group of documents from the sum of
their clipped next-token logits (DP-SynRAG step 4, DP-Synth, DP-RAG).

Axis letters: B rows (documents, padded; at most one public row), V vocabulary.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from dpsynrag_jax.privacy import clipping
from dpsynrag_jax.privacy import mechanisms

CLIP_METHODS = ("grislain", "clamp", "difference")


@dataclasses.dataclass(frozen=True)
class PrivateTokenSelector:
  """decode_loop's `select` for private prediction: one token for the whole cluster.

  method grislain / clamp (the paper):
    utility = sum over document rows of clip_c(logits) + omega * (public row's logits)
  method difference:
    utility = log p_public + sum over document rows of clip(log p_i - log p_public, -c, c)
  token ~ softmax(utility / tau), over the whole vocabulary or, with candidates > 0, over the
  public row's top-`candidates` tokens plus `candidate_ids` (a public list).

  Every document row contributes a vector in [-c, c] and the public row holds no private data
  (its context is the prompt and the tokens already released), so each token is the
  exponential mechanism of `mechanisms.sample_token`: (2c/tau)-DP, (c/tau)^2/2-zCDP; a candidate
  set computed from public data only restricts its range without touching its sensitivity.
  """
  c: float
  tau: float = 1.0
  method: str = "grislain"
  alpha: float = 1.0
  omega: float = 0.0
  candidates: int = 0
  candidate_ids: tuple[int, ...] = ()

  def __post_init__(self):
    if self.method not in CLIP_METHODS:
      raise ValueError(f"Unknown clipping method {self.method!r}; expected one of "
                       f"{CLIP_METHODS}.")
    if self.candidates < 0:
      raise ValueError(f"candidates must be >= 0, got {self.candidates}.")
    # Combinations that would silently do nothing are refused.
    if self.method == "difference" and self.omega:
      raise ValueError("omega (the public prior) has no effect with clip='difference', whose "
                       "utility already adds the public row's log-probabilities; set omega=0.")
    if self.candidate_ids and not self.candidates:
      raise ValueError("candidate_ids (candidate_terms) restrict only the candidate set of "
                       "candidates > 0; set generation.candidates too, or drop the terms.")

  @property
  def needs_public_row(self) -> bool:
    return bool(self.omega) or self.method == "difference" or self.candidates > 0

  def __call__(self, key, logits, aux):
    doc_mask, public_mask = aux
    # The public row's logits [V], only when an option reads them (a [B, V] reduction per step).
    public = (clipping.finite_or_infinite(
        jnp.sum(jnp.where(public_mask[:, None], logits, 0.0), axis=0))
              if self.needs_public_row else None)
    if self.method == "difference":
      utility = (jax.nn.log_softmax(public) +
                 clipping.difference_clipped_sum(logits, doc_mask, public, self.c))
    else:
      utility = clipping.clipped_logit_sum(logits, doc_mask, self.c, method=self.method,
                                          alpha=self.alpha)
      if self.omega:
        # Shifted by its maximum (the same softmax), so a huge public logit cannot overflow.
        top = jnp.max(public)
        utility = utility + self.omega * jnp.where(jnp.isfinite(top), public - top, 0.0)
    vocab_mask = None
    if self.candidates:
      _, top = jax.lax.top_k(public, self.candidates)
      vocab_mask = jnp.zeros(logits.shape[-1], bool).at[top].set(True)
      if self.candidate_ids:
        vocab_mask = vocab_mask.at[jnp.asarray(self.candidate_ids, jnp.int32)].set(True)
    token = mechanisms.sample_token(key, utility, self.tau, vocab_mask=vocab_mask)
    return jnp.broadcast_to(token, logits.shape[:1]).astype(jnp.int32)
