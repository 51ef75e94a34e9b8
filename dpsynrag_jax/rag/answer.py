"""Answering questions from retrieved texts (post-processing of the released database)."""

from __future__ import annotations

from typing import Sequence

QA_PROMPT = ("Answer the question using the documents below.\n\n{context}\n\n"
             "Question: {question}\nAnswer:")
NO_CONTEXT_PROMPT = "Answer the question.\nQuestion: {question}\nAnswer:"


def qa_prompt(question: str, contexts: Sequence[str]) -> str:
  """The retrieved texts, numbered, before the question (no documents: the question alone)."""
  if not contexts:
    return NO_CONTEXT_PROMPT.format(question=question)
  context = "\n".join(f"Document {i + 1}: {c}" for i, c in enumerate(contexts))
  return QA_PROMPT.format(context=context, question=question)


def answer_questions(lm, questions: Sequence[str], contexts: Sequence[Sequence[str]], *,
                     max_new_tokens: int = 48, batch_size: int = 16) -> list[str]:
  """Greedy answers, one per question, each from its own retrieved texts."""
  if len(questions) != len(contexts):
    raise ValueError("questions and contexts must have the same length.")
  if not questions:
    return []
  prompts = [qa_prompt(q, c) for q, c in zip(questions, contexts)]
  return [a.strip() for a in lm.generate(prompts, max_new_tokens, temperature=0.0,
                                         batch_size=batch_size)]
