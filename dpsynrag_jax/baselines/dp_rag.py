"""DP-RAG (Grislain 2025): privacy spent at query time, on every question.

Per question: a threshold drawn by the exponential mechanism (utility -|#{s_i > theta} - k|,
sensitivity 1) selects the private documents most similar to the question; the answer is the
clipped-sum private decode over one prompt per selected document, plus omega times the logits
of the same prompt with no document (public). The total budget is split evenly over the
planned number of questions, so the answers get worse as more questions are planned, and the
ledger refuses a question past the plan.

Budget per question (zCDP): rho_q = eps_to_zcdp(eps_total, delta) / num_queries; the threshold
takes retrieval_share * rho_q (eps_r = sqrt(8 rho)), the T tokens the rest
(`privacy.calibrate_dp_rag`, under either accountant).

Every answer is a release, so the noise matters at once (`noise`, base.NoisyMethod): by default
('secret') a method instance (a question session) draws 64 CSPRNG bits at its first question
and keys every question with them, so no two sessions share noise whatever their public seed;
with a checkpoint_dir (the evaluation's private answer log folder) the secret is kept there and
a resumed session redraws exactly what it drew. 'seeded' keys the questions with the public seed
(reproducible benchmarks, the evaluation's mode: anyone who knows the seed can subtract the
noise, and two datasets evaluated with one seed share it).
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from dpsynrag_jax import privacy
from dpsynrag_jax.baselines.base import Answers, NoisyMethod
from dpsynrag_jax.data.tasks import Task
from dpsynrag_jax.private_decode import PrivatePredictor

ANSWER_PROMPT = ("Question: {q}\nAnswer the question using the document below.\n"
                 "Document: {{d}}")


def answer_template(question: str) -> str:
  """The per-document prompt template of one question, with its {d} slot.

  The question's own braces are escaped: the template is formatted once more per document.
  """
  return ANSWER_PROMPT.format(q=question.replace("{", "{{").replace("}", "}}"))


def question_key(seed: int, session: int, question: int) -> jax.Array:
  """The PRNG key of a session's question (privacy.keys stream 'dp_rag'); folded with 0 for
  the threshold, 1 for the tokens. `seed` is the method's noise seed (the public seed in seeded
  mode)."""
  return privacy.stream_key(seed, "dp_rag", session, question)


@jax.jit
def _select(key, scores, k, eps_r):
  mask = jnp.ones(scores.shape, bool)
  theta = privacy.sample_threshold(key, scores, mask, k, eps_r)
  return privacy.select_above(scores, mask, theta)


class DPRAG(NoisyMethod):
  """Args:
    task: documents and top_k-style settings.
    epsilon_total, delta: budget for ALL planned questions together, calibrated jointly.
    epsilon_per_question: instead of epsilon_total, calibrate each question alone to
      (epsilon_per_question, delta), as the paper's Table 1 does (eps 10 per question); the
      budget is then what num_queries such questions compose to (privacy.dp_rag_epsilon),
      less than num_queries x epsilon_per_question.
    num_queries: questions the budget is planned for.
    k: target number of retrieved documents per question.
    retrieval_share: fraction of each question's rho spent on the threshold.
    T, tau, omega: answer tokens, temperature, public prior weight.
    accountant: 'closed_form' or 'rdp', what c is calibrated (and the ledger read) with.
    embeddings: [N, D] unit embeddings of task.documents when already computed (several
      question sessions over one database share them); private, kept in memory only.
    session: which question session this is (sessions of one seed draw independent keys).
    seed: the public seed (the noise seed with noise='seeded').
    noise: 'secret' (the default: private answers) or 'seeded' (reproducible benchmarks).
  """
  name = "DP-RAG"

  def __init__(self, lm, encoder, task: Task, *, num_queries: int,
               epsilon_total: float | None = None, epsilon_per_question: float | None = None,
               delta: float = 1e-3, k: int = 20, retrieval_share: float = 0.1, T: int = 30,
               tau: float = 1.0, omega: float = 0.01, seed: int = 0,
               embeddings: np.ndarray | None = None, accountant: str = "closed_form",
               session: int = 0, noise: str = "secret"):
    if num_queries < 1:
      raise ValueError("num_queries must be >= 1.")
    if (epsilon_total is None) == (epsilon_per_question is None):
      raise ValueError("Give exactly one of epsilon_total and epsilon_per_question.")
    if not 0 < retrieval_share < 1:
      raise ValueError("retrieval_share must be in (0, 1).")
    self.lm, self.encoder, self.task = lm, encoder, task
    self.k, self.T, self.tau, self.omega = k, T, tau, omega
    self._set_noise(seed, noise)
    self.session = int(session)
    if epsilon_per_question is not None:
      self.eps_r, self.c = privacy.calibrate_dp_rag(
          epsilon_per_question, delta, num_queries=1, T=T, tau=tau,
          retrieval_share=retrieval_share, accountant=accountant)
      epsilon_total = privacy.dp_rag_epsilon(num_queries, self.eps_r, self.c, T=T, tau=tau,
                                             delta=delta, accountant=accountant)
    else:
      self.eps_r, self.c = privacy.calibrate_dp_rag(
          epsilon_total, delta, num_queries=num_queries, T=T, tau=tau,
          retrieval_share=retrieval_share, accountant=accountant)
    self.ledger = privacy.PrivacyLedger(epsilon_total, delta, accountant=accountant)
    self.embeddings = embeddings
    self.predictor = None
    self.asked = 0

  def build(self) -> None:
    if self.embeddings is None:
      self.embeddings = self.encoder.embed(list(self.task.documents))  # private, in memory
    self.predictor = PrivatePredictor(self.lm, c=self.c, tau=self.tau, T=self.T,
                                      omega=self.omega)

  def answer(self, questions: Sequence[str]) -> Answers:
    if self.predictor is None:
      raise RuntimeError("Call build() first.")
    answers, contexts = [], []
    query_vectors = self.encoder.embed(list(questions)) if questions else []
    for q, vector in tqdm.tqdm(list(zip(questions, query_vectors)), desc="DP-RAG questions",
                               unit="question", disable=len(questions) < 2):
      key = question_key(self.noise_seed(), self.session, self.asked)
      self._charge_next_question()
      scores = self.embeddings @ vector
      keep = np.asarray(_select(jax.random.fold_in(key, 0), jnp.asarray(scores),
                                jnp.int32(self.k), jnp.float32(self.eps_r)))
      docs = [self.task.documents[i] for i in np.flatnonzero(keep)]
      # The shared prefix ends before the question: every question then reuses the same
      # compiled programs (the question's tokens are prefilled in each row instead).
      predictor = self.predictor.with_prompt(answer_template(q), shared_until="Question:")
      suffixes = predictor.suffixes(docs)
      (tokens,) = predictor.decode_group([suffixes], [jax.random.fold_in(key, 1)],
                                         predictor.shape_of(suffixes))
      answers.append(predictor.text(tokens))
      contexts.append(docs)  # evaluation only (context recall); never released
    return Answers(answers, contexts)

  def _charge_next_question(self) -> None:
    # Charged before the mechanisms run; raises BudgetExceededError past the plan.
    self.ledger.record(privacy.make_entry("exponential", {"epsilon": self.eps_r},
                                          label=f"query {self.asked} retrieval"))
    self.ledger.record_tokens(None, self.T, self.c, self.tau, label=f"query {self.asked} tokens")
    self.asked += 1

  def skip(self, count: int) -> None:
    """Questions answered by an earlier run: their cost is charged again and their keys are
    used up, so the next question draws the key it would have drawn without the interruption
    (no two questions share noise, and a resumed run answers as an uninterrupted one)."""
    for _ in range(count):
      self._charge_next_question()

  @property
  def epsilon(self) -> float:
    return self.ledger.spent_epsilon()
