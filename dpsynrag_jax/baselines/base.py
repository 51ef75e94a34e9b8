"""The interface every method of the evaluation implements, and the retrieval they share.

    method.build()                       # once; may read the private documents
    out = method.answer(questions)       # any number of times
    method.epsilon                       # privacy spent so far (0, finite, or inf)

Methods that read private data at query time (DP-RAG) charge their ledger on every call; the
others spend nothing after build (post-processing).

Noise (`NoisyMethod`): a private method draws its noise from the keyed streams of privacy.keys,
rooted at a noise seed of one of privacy.keys.NOISE_MODES. 'secret' (the default) is 64 CSPRNG
bits drawn once per method instance: two instances never share noise, whatever their public
seed. 'seeded' is the public seed: reproducible benchmarks (the evaluation harness asks for it),
private against no one who knows the seed.
"""

from __future__ import annotations

import abc
import dataclasses
import os
import secrets
from typing import Sequence

import numpy as np

from dpsynrag_jax import privacy
from dpsynrag_jax.privacy.keys import NOISE_MODES
from dpsynrag_jax.rag import answer as rag_answer
from dpsynrag_jax.rag import index as rag_index


@dataclasses.dataclass
class Answers:
  answers: list[str]
  contexts: list[list[str]]   # the texts each answer was conditioned on (for context recall)


class Method(abc.ABC):
  """A way to answer questions about a private document collection."""
  name: str = "method"
  retrieves: bool = True   # False: no retrieved texts, so context recall does not apply
  # A private folder a long build may keep its progress in (set by the evaluation before
  # build); None: nothing is kept.
  checkpoint_dir: str | None = None

  @abc.abstractmethod
  def build(self) -> None:
    """One-time work over the private documents (index, synthetic database, ...)."""

  @abc.abstractmethod
  def answer(self, questions: Sequence[str]) -> Answers:
    """Answers and the texts each answer saw."""

  def skip(self, count: int) -> None:
    """The next `count` questions were answered by an earlier run of this same method (their
    answers are read back, not asked again): account for them as if asked. A method whose
    answers draw no per-question noise and spend no per-question budget needs nothing."""
    del count

  @property
  @abc.abstractmethod
  def epsilon(self) -> float:
    """Epsilon spent so far at the method's delta (inf when not private)."""

  @property
  def noise(self) -> str | None:
    """How the method's noise is drawn (privacy.keys.NOISE_MODES); None: it draws none."""
    return None


# The secret noise seed of a method instance that keeps state to resume, beside that state in
# its checkpoint_dir (a private folder).
NOISE_SEED_FILE = "noise_seed.json"


class NoisyMethod(Method):
  """A method that draws noise: `seed` is the public config seed, `noise` the mode.

  `noise_seed()` is what every draw is keyed with: the public seed ('seeded'), or ('secret') 64
  CSPRNG bits drawn at the instance's first draw. With a checkpoint_dir (state an interrupted
  run resumes from) the secret is kept there, owner-only, and read back by the resume, so a
  resumed run draws what the interrupted one drew and releases nothing new; without one it
  lives in memory only. It is never part of a released output.
  """
  seed: int = 0
  _noise: str = "secret"
  _noise_seed: int | None = None

  def _set_noise(self, seed: int, noise: str) -> None:
    if noise not in NOISE_MODES:
      raise ValueError(f"noise must be one of {NOISE_MODES}, got {noise!r}.")
    self.seed, self._noise, self._noise_seed = privacy.check_seed(seed), noise, None

  @property
  def noise(self) -> str:
    return self._noise

  def noise_seed(self, resuming: bool = False) -> int:
    """The seed this instance's noise is keyed with (privacy.stream_key's `seed`).

    resuming: the checkpoint_dir holds state drawn with an earlier secret; a missing secret is
    then an error (new noise would be mixed into a release drawn with the old)."""
    if self._noise_seed is None:
      if self._noise == "seeded":
        self._noise_seed = self.seed
      elif self.checkpoint_dir:
        self._noise_seed = privacy.noise_seed(
            "secret", self.seed, os.path.join(self.checkpoint_dir, NOISE_SEED_FILE),
            create=not resuming)
      else:
        self._noise_seed = secrets.randbits(64)
    return self._noise_seed


class Retriever:
  """Top-k texts by cosine similarity of the encoder's unit embeddings (FAISS inner product)."""

  def __init__(self, encoder, texts: Sequence[str], embeddings: np.ndarray | None = None):
    self.encoder = encoder
    self.texts = list(texts)
    if embeddings is None:
      embeddings = (encoder.embed(self.texts) if self.texts
                    else np.zeros((0, encoder.dim), np.float32))
    self.index = rag_index.build_index(embeddings)

  def retrieve(self, questions: Sequence[str], k: int) -> list[list[str]]:
    if not questions:
      return []
    _, ids = rag_index.search(self.index, self.encoder.embed(list(questions)), k)
    return [[self.texts[i] for i in row if i >= 0] for row in ids]


class RetrievalMethod(Method):
  """A method whose build() makes a text collection; answers retrieve top_k texts from it.

  Subclasses set lm, top_k and max_new_tokens, and self.retriever in build(); `reader` is the
  reader prompt (rag.answer; None: the generic 'paper' prompt).
  """
  lm = None
  top_k: int = 10
  max_new_tokens: int = 48
  retriever: Retriever | None = None
  reader: rag_answer.ReaderPrompt | None = None

  def answer(self, questions: Sequence[str]) -> Answers:
    if self.retriever is None:
      raise RuntimeError(f"Call {type(self).__name__}.build() first.")
    contexts = self.retriever.retrieve(questions, self.top_k)
    answers = rag_answer.answer_questions(self.lm, questions, contexts,
                                          max_new_tokens=self.max_new_tokens,
                                          prompt=self.reader)
    return Answers(answers, contexts)
