"""Aug-PE (Xie et al. 2024): private evolution of synthetic text through the model as an API.

1. RANDOM API: the model writes `population` texts from a public prompt (no private data).
2. Each of `iterations` rounds: every private document votes for its nearest synthetic text
   (cosine of unit embeddings); Gaussian noise is added to the vote counts (L2 sensitivity 1:
   a document casts one vote) and counts under `vote_threshold` are zeroed; the next population
   is drawn in proportion to the noisy counts, and the VARIATION API rephrases each draw.
3. The final population is the synthetic database for RAG.

Privacy: `iterations` Gaussian mechanisms of sensitivity 1, rho = iterations / (2 sigma^2),
sigma set so that rho = eps_to_zcdp(epsilon, delta). Everything else is post-processing.

Noise (`noise`, base.NoisyMethod): the votes' Gaussian noise is keyed by a secret 64-bit seed
drawn once per instance by default ('secret'), by the public seed with 'seeded' (reproducible
benchmarks, the evaluation's mode). The model's sampling of the random and variation texts and
the draw of the next population stay on the public seed in both modes: they read only public
prompts and the noisy counts (post-processing), so knowing their randomness reveals nothing the
noisy counts do not, and the two modes then differ only in the mechanism's noise.
"""

from __future__ import annotations

import math
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from dpsynrag_jax import privacy
from dpsynrag_jax.baselines.base import NoisyMethod, RetrievalMethod, Retriever
from dpsynrag_jax.data.tasks import Task

RANDOM_PROMPTS = {
    "medical": ("Write a short doctor's note about a patient: list the patient's symptoms, give "
                "the name of the diagnosed disease and the treatment."),
    "movielens": ("Write a short profile of a movie viewer: age, gender, occupation, favourite "
                  "genres and a list of movies released in the 20th century they like."),
    "searchqa": "Write a short encyclopedia paragraph about a notable person, place or event.",
}
VARIATION_PROMPT = ("Rewrite the following text with small changes, keeping its format.\n"
                    "Text: {x}")


def round_key(seed: int, round_: int) -> jax.Array:
  """The PRNG key of voting round `round_`'s noise (privacy.keys stream 'aug_pe'); `seed` is
  the method's noise seed (the public seed in seeded mode)."""
  return privacy.stream_key(seed, "aug_pe", round_)


@jax.jit
def _noisy_votes(key, private, synthetic, sigma):
  """private [N, D], synthetic [M, D] unit rows -> noisy nearest-neighbour counts [M]."""
  nearest = jnp.argmax(private @ synthetic.T, axis=1)
  counts = jnp.zeros(synthetic.shape[0], jnp.float32).at[nearest].add(1.0)
  return privacy.gaussian_mechanism(key, counts, sigma)


class AugPE(NoisyMethod, RetrievalMethod):
  """Args:
    epsilon, delta: the run's budget, spent over `iterations` voting rounds.
    population: synthetic texts per round (the database size).
    iterations: private voting rounds.
    max_new_tokens, temperature: generation of the random and variation texts.
    vote_threshold: noisy vote counts below it are zeroed before drawing.
    seed: the public seed (generation and population draws; the votes' noise too with
      noise='seeded').
    noise: 'secret' (the default: a private release) or 'seeded' (a reproducible benchmark).
  """
  name = "Aug-PE"

  def __init__(self, lm, encoder, task: Task, *, epsilon: float = 10.0, delta: float = 1e-3,
               population: int = 64, iterations: int = 2, max_new_tokens: int = 64,
               temperature: float = 1.0, vote_threshold: float = 2.0, seed: int = 0,
               answer_tokens: int = 48, noise: str = "secret"):
    if population < 1 or iterations < 1:
      raise ValueError("population and iterations must be >= 1.")
    self.lm, self.encoder, self.task = lm, encoder, task
    self.population, self.iterations = population, iterations
    self.text_tokens, self.temperature = max_new_tokens, temperature
    self.vote_threshold = vote_threshold
    self._set_noise(seed, noise)
    self.top_k, self.max_new_tokens = task.top_k, answer_tokens
    self.sigma = math.sqrt(iterations / (2.0 * privacy.eps_to_zcdp(epsilon, delta)))
    self.ledger = privacy.PrivacyLedger(epsilon, delta)
    self.synthetic_texts: list[str] = []

  def _generate(self, prompts: Sequence[str], round_: int) -> list[str]:
    return [t.strip() for t in self.lm.generate(list(prompts), self.text_tokens,
                                                temperature=self.temperature,
                                                seed=self.seed * 1000 + round_)]

  def build(self) -> None:
    prompt = RANDOM_PROMPTS.get(self.task.name, RANDOM_PROMPTS["searchqa"])
    texts = self._generate([prompt] * self.population, 0)
    private = jnp.asarray(self.encoder.embed(list(self.task.documents)))
    rng = np.random.default_rng(self.seed)
    for round_ in range(1, self.iterations + 1):
      self.ledger.record_gaussian(1.0, self.sigma, label=f"round {round_} votes")
      votes = np.asarray(_noisy_votes(round_key(self.noise_seed(), round_), private,
                                      jnp.asarray(self.encoder.embed(texts)), self.sigma))
      weights = np.where(votes >= self.vote_threshold, votes, 0.0)
      if weights.sum() <= 0:  # every count drowned in noise: keep the population as is
        weights = np.ones_like(weights)
      picks = rng.choice(len(texts), size=self.population, p=weights / weights.sum())
      texts = self._generate([VARIATION_PROMPT.format(x=texts[i]) for i in picks], round_)
    self.synthetic_texts = [t for t in texts if t]
    self.retriever = Retriever(self.encoder, self.synthetic_texts)

  @property
  def epsilon(self) -> float:
    return self.ledger.spent_epsilon()
