"""DP-Synth (Amin et al. 2024): private prediction over disjoint batches, no retrieval structure.

Documents are split into `num_batches` disjoint batches; each batch is rephrased into one
synthetic text by the same clipped-sum private decode as DP-SynRAG, then self-filtered and
indexed. Every document is in exactly one batch, so by parallel composition the run costs one
batch's T tokens: rho = T (c/tau)^2 / 2, with c set to spend eps_total (no histogram, no
re-ranking, L = 1).

A document's batch is a keyed hash of its text and `num_batches` is a public config value
(the paper's batches of 100 on 8000 notes: 80), so a document's batch depends on that document
alone and the number of texts on nothing private. Deriving it from the corpus size,
ceil(N / batch_size), would let one added document re-partition every other and change how many
texts are released: no finite epsilon under add/remove neighbouring.

Noise (`noise`, base.NoisyMethod): the batches' token keys come from a secret 64-bit seed by
default ('secret'), from the public seed with 'seeded' (the evaluation's reproducible
benchmarks, today's draws exactly). The batch hash stays keyed by the PUBLIC seed in both
modes: it is not noise. Each batch's text is DP for any fixed partition in which a document's
batch depends on that document alone, whoever can compute it, so a secret key would protect
nothing; and a public one keeps the two modes' batches (and a checkpoint's batch digests) equal.
"""

from __future__ import annotations

import hashlib
import os

import jax
import numpy as np
import tqdm

from dpsynrag_jax import privacy
from dpsynrag_jax.baselines.base import NoisyMethod, RetrievalMethod, Retriever
from dpsynrag_jax.data.tasks import Task
from dpsynrag_jax.synrag import self_filter
from dpsynrag_jax.synrag import workdir as wd_lib
from dpsynrag_jax.private_decode import PrivatePredictor, decode_many


def batch_of(text: str, seed: int, num_batches: int) -> int:
  """A document's batch: a hash of its text keyed by the public seed (independent of every
  other document; not noise, see the module docstring)."""
  digest = hashlib.sha256(f"{seed}:{text}".encode("utf-8")).digest()
  return int.from_bytes(digest[:8], "little") % num_batches


def batch_key(seed: int, batch: int) -> jax.Array:
  """The PRNG key of one batch's tokens (privacy.keys stream 'dp_synth'); `seed` is the
  method's noise seed (the public seed in seeded mode)."""
  return privacy.stream_key(seed, "dp_synth", batch)


class DPSynth(NoisyMethod, RetrievalMethod):
  """Args:
    task: documents, self-filter prompt and top_k.
    epsilon, delta: the whole run's budget.
    T, tau: private tokens per synthetic text and sampling temperature.
    num_batches: how many batches (and texts); public, never derived from the corpus size.
    accountant: 'closed_form' or 'rdp', the accountant c is calibrated (and the ledger read)
      with.
    seed: the public seed (the batch hash; the noise too with noise='seeded').
    noise: 'secret' (a private release: 64 CSPRNG bits, kept beside the checkpoint when there
      is one) or 'seeded' (a reproducible benchmark, not private).
  """
  name = "DP-Synth"

  def __init__(self, lm, encoder, task: Task, *, epsilon: float = 10.0, delta: float = 1e-3,
               T: int = 70, tau: float = 1.0, num_batches: int = 80, seed: int = 0,
               self_filter_enabled: bool = True, max_new_tokens: int = 48,
               accountant: str = "closed_form", noise: str = "secret"):
    if isinstance(num_batches, bool) or int(num_batches) != num_batches or num_batches < 1:
      raise ValueError(f"num_batches must be a positive integer, got {num_batches!r}.")
    self.lm, self.encoder, self.task = lm, encoder, task
    self.T, self.tau, self.num_batches = T, tau, int(num_batches)
    self._set_noise(seed, noise)
    self.self_filter_enabled = self_filter_enabled
    self.top_k, self.max_new_tokens = task.top_k, max_new_tokens
    self.c = privacy.calibrate_dp_synth(epsilon, delta, T=T, tau=tau, accountant=accountant)
    self.ledger = privacy.PrivacyLedger(epsilon, delta, accountant=accountant,
                                        max_clusters_per_document=1)
    self.synthetic_texts: list[str] = []

  def batches(self, documents) -> dict[int, list[str]]:
    """batch -> its documents, for every batch 0 .. num_batches - 1 (empty ones included)."""
    batches: dict[int, list[str]] = {b: [] for b in range(self.num_batches)}
    for d in documents:
      batches[batch_of(d, self.seed, self.num_batches)].append(d)
    return batches

  def build(self) -> None:
    batches = self.batches(self.task.documents)
    predictor = PrivatePredictor(self.lm, c=self.c, tau=self.tau, T=self.T)
    for b in range(self.num_batches):  # every batch charged before any is decoded, in order
      self.ledger.record_tokens(b, self.T, self.c, self.tau)
    tokens = self._decoded(batches)
    seed = self.noise_seed(resuming=bool(tokens))
    todo = {b: predictor.suffixes(ds) for b, ds in batches.items() if b not in tokens}
    with tqdm.tqdm(total=self.num_batches, initial=self.num_batches - len(todo),
                   desc="DP-Synth decode", unit="batch") as bar:
      tokens.update(decode_many(predictor, todo, lambda b: batch_key(seed, b),
                                progress=bar, after_group=self._keep(batches)))
    texts = [predictor.text(tokens[b]) for b in range(self.num_batches)]
    keep = np.array([bool(t) for t in texts])
    prompt = self.task.self_filter_prompt
    if self.self_filter_enabled and prompt:
      keep &= self_filter.self_filter(self.lm, texts,
                                      self_filter.filter_prompt(prompt))
    self.synthetic_texts = [t for t, k in zip(texts, keep) if k]
    self.retriever = Retriever(self.encoder, self.synthetic_texts)

  def _digest(self, batch: list[str]) -> str:
    """What decides a batch's tokens besides its key: its documents and the mechanism."""
    mechanism = f"{self.c!r}:{self.tau!r}:{self.T}:{self.seed}"
    if self.noise != "seeded":   # seeded checkpoints keep the digests they were written with
      mechanism += f":{self.noise}"
    text = "\x00".join([mechanism] + batch)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()

  def _checkpoint(self) -> str | None:
    return (os.path.join(self.checkpoint_dir, "dp_synth_tokens.jsonl")
            if self.checkpoint_dir else None)

  def _decoded(self, batches) -> dict[int, list[int]]:
    """Batches an interrupted run already decoded (checkpoint_dir), the same draws as a
    fresh decode (keyed by batch); a batch whose documents or mechanism changed is refused."""
    path = self._checkpoint()
    if not path or not os.path.exists(path):
      return {}
    done = {}
    for record in wd_lib.read_jsonl(path):
      b = record["batch"]
      if b not in batches or record["digest"] != self._digest(batches[b]):
        raise ValueError(f"{path} holds batch {b} of other documents or settings; delete it "
                         "to decode again.")
      done[b] = record["tokens"]
    return done

  def _keep(self, batches):
    """decode_many's after_group: appends each decoded group to the checkpoint."""
    path = self._checkpoint()
    if not path:
      return lambda out: None
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return lambda out: wd_lib.append_jsonl(path, [
        {"batch": b, "digest": self._digest(batches[b]), "tokens": t}
        for b, t in sorted(out.items())])

  @property
  def epsilon(self) -> float:
    return self.ledger.spent_epsilon()
