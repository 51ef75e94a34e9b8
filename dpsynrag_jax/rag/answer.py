"""Answering questions from retrieved texts (post-processing of the released database).

A reader prompt is (a user message with the retrieved texts and the question, an answer
prefix that opens the assistant's turn, the order the texts are listed in). 'paper' is the
generic prompt this project started with; 'focused' restates the task's question after the
texts and opens the answer with words that must be followed by the answer itself, which a
135M model follows where it ignores the generic one (BUILD_NOTES, "Reader prompts": chosen on
validation questions only). Greedy decoding; the answer returned includes the prefix.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

NO_CONTEXT_PROMPT = "Answer the question.\nQuestion: {question}\nAnswer:"


@dataclasses.dataclass(frozen=True)
class ReaderPrompt:
  """template: the user message, with {context} (numbered texts) and {question};
  prefix: the assistant's first words; nearest_last: list the best match last (closest to the
  question), else first."""
  template: str
  prefix: str = ""
  nearest_last: bool = False


_FOCUSED = ("Documents:\n{context}\n\n{question}\n{instruction}")
READER_PROMPTS = {
    "paper": {None: ReaderPrompt("Answer the question using the documents below.\n\n{context}"
                                 "\n\nQuestion: {question}\nAnswer:")},
    "focused": {
        "medical": ReaderPrompt(_FOCUSED.replace(
            "{instruction}", "Answer with the name of the disease that the documents give for "
            "these symptoms."), prefix="The disease is", nearest_last=True),
        "movielens": ReaderPrompt(_FOCUSED.replace(
            "{instruction}", "Answer with the titles of movies that users like this one "
            "enjoy, from the documents."), prefix="I recommend", nearest_last=True),
        "searchqa": ReaderPrompt(_FOCUSED.replace(
            "{instruction}", "Answer with a short phrase from the documents."),
            prefix="The answer is", nearest_last=True),
        None: ReaderPrompt(_FOCUSED.replace("{instruction}", "Answer from the documents."),
                           prefix="The answer is", nearest_last=True),
    },
}
# Variants measured beside them when choosing (experiments.reader_prompts): the paper's
# prompt with the task's answer prefix, and the focused prompt with the best match first.
READER_PROMPTS["paper_prefix"] = {
    task: dataclasses.replace(READER_PROMPTS["paper"][None], prefix=p.prefix)
    for task, p in READER_PROMPTS["focused"].items()}
READER_PROMPTS["focused_best_first"] = {
    task: dataclasses.replace(p, nearest_last=False)
    for task, p in READER_PROMPTS["focused"].items()}
DEFAULT_READER = "focused"


def reader_prompt(style: str = DEFAULT_READER, task: str | None = None) -> ReaderPrompt:
  """The reader prompt of `style` ('paper' or 'focused') for task `task` (or the generic one)."""
  if style not in READER_PROMPTS:
    raise ValueError(f"Unknown reader prompt {style!r}; expected one of {sorted(READER_PROMPTS)}.")
  prompts = READER_PROMPTS[style]
  return prompts.get(task, prompts[None])


def qa_prompt(question: str, contexts: Sequence[str],
              prompt: ReaderPrompt | None = None) -> str:
  """The user message: retrieved texts, numbered, and the question (no texts: the question
  alone). contexts are in retrieval order, best first."""
  prompt = prompt or reader_prompt("paper")
  if not contexts:
    return NO_CONTEXT_PROMPT.format(question=question)
  listed = list(reversed(contexts)) if prompt.nearest_last else list(contexts)
  context = "\n".join(f"Document {i + 1}: {c}" for i, c in enumerate(listed))
  return prompt.template.format(context=context, question=question)


def answer_questions(lm, questions: Sequence[str], contexts: Sequence[Sequence[str]], *,
                     max_new_tokens: int = 48, batch_size: int = 16,
                     prompt: ReaderPrompt | None = None,
                     prefill_chunk: int | None = None) -> list[str]:
  """Greedy answers, one per question, each from its own retrieved texts.

  prefill_chunk: LanguageModel.prefill's `chunk` (None: its default); a small one bounds the
  reader's peak memory, and its answers can differ from the default's in float rounding."""
  if len(questions) != len(contexts):
    raise ValueError("questions and contexts must have the same length.")
  if not questions:
    return []
  prompt = prompt or reader_prompt("paper")
  prefix = prompt.prefix
  texts = [lm.chat_prompt(qa_prompt(q, c, prompt)) + (prefix if c else "")
           for q, c in zip(questions, contexts)]
  outs = lm.generate(texts, max_new_tokens, temperature=0.0, batch_size=batch_size, chat=False,
                     prefill_chunk=prefill_chunk)
  return [((prefix + " " if c and prefix else "") + a.strip()).strip()
          for a, c in zip(outs, contexts)]
