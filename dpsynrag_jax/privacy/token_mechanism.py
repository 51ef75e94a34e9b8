"""The private token mechanism: one token for a whole group of documents from the sum of
their clipped next-token logits (DP-SynRAG step 4, DP-Synth, DP-RAG).

Axis letters: B rows (documents, padded; at most one public row), V vocabulary.
"""

from __future__ import annotations

import dataclasses
import math

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
  public row's top-`candidates` tokens, widened by every token whose public logit is within
  `candidate_width` nats of the candidates-th largest (InvisibleInk's top-k+), plus
  `candidate_ids` (a public list). With min_length > 0, `eos_ids` are not allowed before step
  min_length (the step index is public), so a text cannot end before it.

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
  candidate_width: float = 0.0   # nats below the candidates-th public logit still admitted
  min_length: int = 0            # steps before which no EOS may be drawn
  eos_ids: tuple[int, ...] = ()
  public_row: bool = False    # read the public row even if no option above needs it (the SVT)

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
    if not (self.candidate_width >= 0 and math.isfinite(self.candidate_width)):
      raise ValueError(f"candidate_width must be finite and >= 0, got {self.candidate_width!r}.")
    if self.candidate_width and not self.candidates:
      raise ValueError("candidate_width widens the public top-k of candidates > 0; set "
                       "generation.candidates too, or drop the width.")
    if self.min_length < 0:
      raise ValueError(f"min_length must be >= 0, got {self.min_length}.")
    if self.min_length and not self.eos_ids:
      raise ValueError("min_length bans EOS before a step: give eos_ids.")

  @property
  def stateful(self) -> bool:
    """Whether decode_loop must thread a state (the step index, for min_length)."""
    return self.min_length > 0

  @property
  def needs_public_row(self) -> bool:
    return (bool(self.omega) or self.method == "difference" or self.candidates > 0 or
            self.public_row)

  def utility(self, logits, aux, step=None):
    """(utility [V], vocab_mask [V] bool or None, public row's logits [V] or None) of one step:
    what __call__ samples from, each entry moved by at most c by one document. step: the
    step's index (a scalar), read only by min_length."""
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
    vocab_mask = self._candidate_mask(public) if self.candidates else None
    if self.min_length:
      if step is None:
        raise ValueError("min_length needs the step index: run the selector statefully.")
      eos = jnp.zeros(logits.shape[-1], bool).at[jnp.asarray(self.eos_ids, jnp.int32)].set(True)
      allowed = jnp.ones(logits.shape[-1], bool) if vocab_mask is None else vocab_mask
      vocab_mask = allowed & ~(eos & (step < self.min_length))
    return utility, vocab_mask, public

  def _candidate_mask(self, public):
    """[V] bool: the public top-k, every token within candidate_width of its k-th logit, and
    candidate_ids."""
    top_values, top = jax.lax.top_k(public, self.candidates)
    mask = jnp.zeros(public.shape, bool).at[top].set(True)
    if self.candidate_width:
      mask = mask | (public >= top_values[-1] - self.candidate_width)
    if self.candidate_ids:
      mask = mask.at[jnp.asarray(self.candidate_ids, jnp.int32)].set(True)
    return mask

  def select_at(self, key, logits, aux, step=None):
    """tokens [B] (the same token on every row) of the step `step`."""
    utility, vocab_mask, _ = self.utility(logits, aux, step)
    token = mechanisms.sample_token(key, utility, self.tau, vocab_mask=vocab_mask)
    return jnp.broadcast_to(token, logits.shape[:1]).astype(jnp.int32)

  def __call__(self, key, logits, aux):
    return self.select_at(key, logits, aux)

  def initial_state(self, key):
    del key
    return jnp.zeros((), jnp.int32)

  def step(self, key, logits, aux, state):
    """(tokens [B], next state) of the stateful protocol; state is the step index."""
    return self.select_at(key, logits, aux, state), state + 1


# Where a sparse-vector selector's per-instance threshold noise is drawn: key streams folded
# into the cluster key apart from the decode loop's per-step keys (0 .. T - 1).
_SVT_THRESHOLD_STREAM = 2**31 - 1


@dataclasses.dataclass(frozen=True)
class SparseVectorSelector:
  """Free public tokens: a sparse vector test decides, per step, whether the cluster's private
  prediction disagrees with the public row's; only then is a private token paid for.

  Per step, with u the utility of `base` (one document moves each entry by at most c), A the
  allowed tokens (base's candidate set, or the vocabulary) and a the public row's top allowed
  token (public: the prompt with no document and the tokens already released):

    gap = (max_{j in A} u_j - u_a) / (2c)      in documents: sensitivity 1 (each term moves <= c)

  An AboveThreshold instance (mechanisms.svt_above, parameter epsilon_test) tests
  gap >= threshold. Below it, the step emits a, at no cost beyond the running instance. Above
  it, the step draws base's private token (2c/tau-DP) and a new instance starts with a fresh
  noisy threshold. After `paid` paid tokens (a public constant) no test runs and every later
  token is the public row's top token: post-processing. A cluster's text therefore costs at most
  `paid` x (one instance + one token), whatever T is; the ledger charges exactly that.

  Axis letters: B rows, V vocabulary.
  """
  base: PrivateTokenSelector
  threshold: float = 1.0      # in documents
  epsilon_test: float = 0.1
  paid: int = 16

  def __post_init__(self):
    if not self.base.needs_public_row:
      raise ValueError("SparseVectorSelector needs a base selector that reads the public row "
                       "(PrivateTokenSelector(public_row=True)).")
    if not (self.epsilon_test > 0 and math.isfinite(self.epsilon_test)):
      raise ValueError(f"epsilon_test must be finite and > 0, got {self.epsilon_test!r}.")
    if self.paid < 1:
      raise ValueError(f"paid must be >= 1, got {self.paid}.")

  @property
  def needs_public_row(self) -> bool:
    return True

  @property
  def stateful(self) -> bool:
    return True

  def initial_state(self, key):
    """(noisy threshold of the first instance, paid tokens so far, step index)."""
    noisy = mechanisms.svt_noisy_threshold(jax.random.fold_in(key, _SVT_THRESHOLD_STREAM),
                                           self.threshold, self.epsilon_test)
    return noisy, jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32)

  def gap(self, utility, vocab_mask, public):
    """(gap in documents, the public row's top allowed token)."""
    allowed = jnp.ones(utility.shape, bool) if vocab_mask is None else vocab_mask
    public_token = jnp.argmax(jnp.where(allowed, public, -jnp.inf))
    top = jnp.max(jnp.where(allowed, utility, -jnp.inf))
    return (top - utility[public_token]) / (2.0 * self.base.c), public_token

  def step(self, key, logits, aux, state):
    """(tokens [B], next state): one step of the test and, above it, a paid private token."""
    noisy_threshold, paid_so_far, t = state
    test_key, token_key, threshold_key = jax.random.split(key, 3)
    utility, vocab_mask, public = self.base.utility(logits, aux, t)
    gap, public_token = self.gap(utility, vocab_mask, public)
    pay = (paid_so_far < self.paid) & mechanisms.svt_above(test_key, gap, noisy_threshold,
                                                            self.epsilon_test)
    private_token = mechanisms.sample_token(token_key, utility, self.base.tau,
                                            vocab_mask=vocab_mask)
    token = jnp.where(pay, private_token, public_token)
    fresh = mechanisms.svt_noisy_threshold(threshold_key, self.threshold, self.epsilon_test)
    state = (jnp.where(pay, fresh, noisy_threshold), paid_so_far + pay.astype(jnp.int32), t + 1)
    return jnp.broadcast_to(token, logits.shape[:1]).astype(jnp.int32), state
