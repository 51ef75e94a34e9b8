"""One method answered and scored: the resumable answer log, the scored row, and rows scored
again from their logs when the answer matchers change (SCORING)."""

from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Sequence

from dpsynrag_jax import baselines
from dpsynrag_jax.data.tasks import Task
from dpsynrag_jax.rag import answer as rag_answer
from dpsynrag_jax.rag import metrics
from dpsynrag_jax.synrag import workdir as wd_lib


# Questions answered between two appends to the answer log: two full reader batches (the
# language model pads a batch to a multiple of 8 rows; 10 questions ran 16 rows, 6 of them
# padding, which on MovieLens' 2048-token RAG prompts was 37 % of the prefill).
ANSWER_CHUNK = 16


def _question_digest(text: str) -> str:
  return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _answers_to(records: Sequence[dict], questions: Sequence[str]) -> bool:
  """Whether logged `records` answer the first len(records) of `questions`, in order."""
  return len(records) <= len(questions) and all(
      r["question"] == _question_digest(q) for r, q in zip(records, questions))


def answer_resumably(method: baselines.Method, questions: Sequence[str],
                     log_path: str | None) -> tuple[baselines.Answers, float]:
  """method.answer over `questions`, appending every ANSWER_CHUNK answers to the JSONL
  `log_path`, so that a run cut off resumes after the last chunk logged; (answers, seconds
  spent answering over every run). With log_path None, one call and nothing written.

  Answers read back are not asked again; `method.skip` accounts for them (DP-RAG charges
  their budget and uses up their keys), so a resumed run gives what an uninterrupted one
  gives. The log holds the texts each answer saw (private documents for RAG and DP-RAG): it
  belongs under a work dir's private/ side.
  """
  if log_path is None:
    start = time.time()
    return method.answer(list(questions)), time.time() - start
  done = read_answer_log(log_path, questions)
  method.skip(len(done))
  for begin in range(len(done), len(questions), ANSWER_CHUNK):
    chunk = list(questions[begin:begin + ANSWER_CHUNK])
    start = time.time()
    out = method.answer(chunk)
    done.extend(log_answers(log_path, chunk, out, time.time() - start))
  return answers_of(done), sum(r["seconds"] for r in done)


def read_answer_log(log_path: str, questions: Sequence[str]) -> list[dict]:
  """The records of an answer log (answer_resumably's format), checked to answer the first of
  `questions` in order; the file is rewritten as read, so a torn last line is not followed by
  new records. A missing log reads as no records."""
  done = wd_lib.read_jsonl(log_path)
  if not _answers_to(done, questions):
    raise ValueError(f"{log_path} logs answers to other questions than these; delete it to "
                     "answer again.")
  os.makedirs(os.path.dirname(log_path), exist_ok=True)
  wd_lib.atomic_write_text(log_path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in done))
  return done


def log_answers(log_path: str, questions: Sequence[str], out: baselines.Answers,
                seconds: float) -> list[dict]:
  """Appends the answers `out` to `questions` (taking `seconds` in all) to the log; returns
  the records written."""
  each = seconds / max(len(questions), 1)
  records = [{"question": _question_digest(q), "answer": a, "context": list(c),
              "seconds": round(each, 3)} for q, a, c in zip(questions, out.answers, out.contexts)]
  wd_lib.append_jsonl(log_path, records)
  return records


def answers_of(records: Sequence[dict]) -> baselines.Answers:
  return baselines.Answers([r["answer"] for r in records], [r["context"] for r in records])


def evaluate_method(method: baselines.Method, task: Task, queries,
                    attacks: Sequence[str] = (), log_dir: str | None = None) -> dict:
  """Builds, answers and scores one method; the row of the results table (with "noise", the
  method's noise mode, for a method that draws noise).

  `attacks` are extraction questions asked after the benign ones; only their leakage counts.
  With `log_dir` (private: it holds what each answer saw), answers are logged as they come
  (answer_resumably) and a rerun after a crash continues from the last logged chunk.
  """
  start = time.time()
  if log_dir:
    method.checkpoint_dir = log_dir
  method.build()
  built = time.time()
  log = (lambda part: os.path.join(log_dir, f"{part}.jsonl")) if log_dir else (lambda part: None)
  out, seconds_answer = answer_resumably(method, [q.text for q in queries], log("benign"))
  attack_answers = []
  if attacks:
    # Extraction questions go through the generic reader prompt: a task prompt that asks for a
    # disease would hide what the texts let a reader print (a defence by prompt, not privacy).
    reader = getattr(method, "reader", None)
    if reader is not None:
      method.reader = rag_answer.reader_prompt("paper")
    attack_out, attack_seconds = answer_resumably(method, list(attacks), log("attacks"))
    attack_answers = attack_out.answers
    seconds_answer += attack_seconds
    if reader is not None:
      method.reader = reader
  noise = {"noise": method.noise} if method.noise else {}
  return {
      **score_answers(task, queries, out, method.retrieves, attacks, attack_answers),
      **noise,
      "epsilon": method.epsilon,
      "questions": len(queries),
      "seconds_build": round(built - start, 1),
      "seconds_answer": round(seconds_answer, 1),
  }


# Version of the tasks' answer matchers. A results row scored under an older one is scored
# again from its answer log (rescore_row), never answered again. 2: SearchQA answers must
# appear as whole words (a gold "C" had matched every answer holding the letter c).
SCORING = 2


def score_answers(task: Task, queries, out: baselines.Answers, retrieves: bool,
                  attacks: Sequence[str] = (), attack_answers: Sequence[str] = ()) -> dict:
  """The scored part of a results row: accuracy, context recall, leakage, examples."""
  golds = [q.answers for q in queries]
  per_question = {  # for analyses by question (rare topics); gold answers are public test data
      "gold": [list(g) for g in golds],
      "correct": [int(task.matches(a, g)) for a, g in zip(out.answers, golds)],
      "recalled": ([int(any(task.matches(c, g) for c in ctx))
                    for ctx, g in zip(out.contexts, golds)] if retrieves else None),
  }
  return {
      "accuracy": metrics.accuracy(out.answers, golds, task.matches),
      "context_recall": (metrics.context_recall(out.contexts, golds, task.matches)
                         if retrieves else None),
      "leakage": metrics.leakage(out.answers, task.private_names),
      "attacks": len(attacks),
      "attack_leakage": metrics.leakage(list(attack_answers), task.private_names),
      "examples": [{"question": q.text, "gold": list(q.answers), "answer": a}
                   for q, a in list(zip(queries, out.answers))[:3]],
      "attack_examples": [{"question": q, "answer": a}
                          for q, a in list(zip(attacks, attack_answers))[:3]],
      "per_question": per_question,
      "scoring": SCORING,
  }


def _logged(log_path: str, questions: Sequence[str]) -> baselines.Answers | None:
  """The answers a log holds to exactly `questions`, or None if it holds other or fewer."""
  done = wd_lib.read_jsonl(log_path)
  if len(done) != len(questions) or not _answers_to(done, questions):
    return None
  return baselines.Answers([r["answer"] for r in done], [r["context"] for r in done])


def rescore_row(row: dict, task: Task, queries, attacks: Sequence[str],
                log_dir: str) -> dict | None:
  """`row` scored again under SCORING from its answer logs (nothing is asked again), or None
  where the logs do not hold every answer the row was scored on."""
  out = _logged(os.path.join(log_dir, "benign.jsonl"), [q.text for q in queries])
  if out is None:
    return None
  attack_answers = []
  if attacks:
    attack_out = _logged(os.path.join(log_dir, "attacks.jsonl"), list(attacks))
    if attack_out is None:
      return None
    attack_answers = attack_out.answers
  retrieves = row.get("context_recall") is not None
  return {**row, **score_answers(task, queries, out, retrieves, attacks, attack_answers)}
