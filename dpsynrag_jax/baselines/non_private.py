"""The two non-private ends of the range: no retrieval (eps 0) and RAG on the private data (inf)."""

from __future__ import annotations

import math
from typing import Sequence

from dpsynrag_jax.baselines.base import Answers, Method, RetrievalMethod, Retriever
from dpsynrag_jax.data.tasks import Task
from dpsynrag_jax.rag import answer as rag_answer


class NonRAG(Method):
  """The model answers from its own knowledge; the private data is never read."""
  name = "Non-RAG"
  retrieves = False

  def __init__(self, lm, *, max_new_tokens: int = 48):
    self.lm = lm
    self.max_new_tokens = max_new_tokens

  def build(self) -> None:
    pass

  def answer(self, questions: Sequence[str]) -> Answers:
    contexts = [[] for _ in questions]
    answers = rag_answer.answer_questions(self.lm, questions, contexts,
                                          max_new_tokens=self.max_new_tokens)
    return Answers(answers, contexts)

  @property
  def epsilon(self) -> float:
    return 0.0


class RAG(RetrievalMethod):
  """Retrieval over the private documents themselves: the upper bound, with no privacy."""
  name = "RAG"

  def __init__(self, lm, encoder, task: Task, *, max_new_tokens: int = 48):
    self.lm, self.encoder, self.task = lm, encoder, task
    self.top_k, self.max_new_tokens = task.top_k, max_new_tokens

  def build(self) -> None:
    self.retriever = Retriever(self.encoder, self.task.documents)

  @property
  def epsilon(self) -> float:
    return math.inf
