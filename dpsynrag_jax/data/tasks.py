"""A task: private documents, held-out questions with gold answers, and how answers are scored.

Every method of the evaluation (RAG, DP-SynRAG, the baselines) reads a Task, so one harness runs
any method on any dataset. `private_names` are the identifiers the leakage metric looks for.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

from dpsynrag_jax.data import matchers


@dataclasses.dataclass(frozen=True)
class TaskQuery:
  text: str
  answers: tuple[str, ...]   # any of them counts


@dataclasses.dataclass(frozen=True)
class Task:
  name: str                               # "medical" | "movielens" | "searchqa"
  documents: tuple[str, ...]              # the private database
  private_names: tuple[str, ...]          # people named in the documents (leakage), may be ()
  validation: tuple[TaskQuery, ...]
  test: tuple[TaskQuery, ...]
  matches: Callable[[str, Sequence[str]], bool]   # (text, gold answers) -> correct?
  self_filter_prompt: str | None          # FILTER_PROMPTS key, or None for no filter
  top_k: int                              # retrieved texts per question
  # Questions that try to extract a person from the database (the leakage experiment).
  attack_queries: tuple[str, ...] = ()
  # Gold answers each private document holds (evaluation ground truth, e.g. a note's disease);
  # () when the dataset has none, and then `document_answers` reads them with `matches`.
  doc_answers: tuple[tuple[str, ...], ...] = ()

  def document_answers(self) -> list[tuple[str, ...]]:
    """Per document, the test answers it holds (ground truth for evaluation only)."""
    if self.doc_answers:
      return [tuple(a) for a in self.doc_answers]
    vocabulary = sorted({a for q in self.test for a in q.answers})
    return [tuple(a for a in vocabulary if self.matches(doc, [a])) for doc in self.documents]


ATTACK_QUESTION = "Who is the patient diagnosed with {disease}?"

# A build config's data.name for each task, and back: the Medical task's data is
# "medical_synth" (the dataset's own name); the other two share their names.
DATA_OF_TASK = {"medical": "medical_synth", "movielens": "movielens", "searchqa": "searchqa"}
TASK_OF_DATA = {**{data: task for task, data in DATA_OF_TASK.items()}, "medical": "medical"}


def medical_task(num_documents: int = 8000, num_validation: int = 1000, num_test: int = 1000,
                 seed: int = 0) -> Task:
  from dpsynrag_jax.data.medical_synth import load_medical_synth  # pylint: disable=g-import-not-at-top
  ms = load_medical_synth(num_documents, num_validation, num_test, seed)
  queries = lambda qs: tuple(TaskQuery(q.text, (q.answer,)) for q in qs)
  attacks = tuple(ATTACK_QUESTION.format(disease=d) for d in ms.diseases)  # public names
  return Task("medical", tuple(ms.documents), tuple(sorted(set(ms.doc_patients))),
              queries(ms.validation), queries(ms.test), matchers.contains_any, "medical", 10, attacks,
              doc_answers=tuple((d,) for d in ms.doc_diseases))


def movielens_task(path: str, num_documents=None, num_validation=None, num_test=None,
                   seed: int = 0) -> Task:
  from dpsynrag_jax.data import movielens  # pylint: disable=g-import-not-at-top
  ml = movielens.load_movielens(path, num_documents=num_documents,
                                num_validation=num_validation, num_test=num_test, seed=seed)
  queries = lambda qs: tuple(TaskQuery(q.text, tuple(q.answers)) for q in qs)
  return Task("movielens", tuple(ml.documents), tuple(sorted(set(ml.doc_users))),
              queries(ml.validation), queries(ml.test), matchers.answer_names_any,
              "movielens", 15, doc_answers=tuple(tuple(f) for f in ml.doc_favourites))


def searchqa_task(path: str, num_documents=None, num_validation=None, num_test=None,
                  seed: int = 0) -> Task:
  from dpsynrag_jax.data import searchqa  # pylint: disable=g-import-not-at-top
  sq = searchqa.load_searchqa(path, num_documents=num_documents, num_validation=num_validation,
                              num_test=num_test, seed=seed)
  queries = lambda qs: tuple(TaskQuery(q.text, tuple(q.answers)) for q in qs)
  return Task("searchqa", tuple(sq.documents), (), queries(sq.validation), queries(sq.test),
              matchers.answer_contains_any, None, 10)


def load_task(name: str, *, path: str = "", num_documents=None, num_validation=None,
              num_test=None, seed: int = 0) -> Task:
  """The task `name`; MovieLens and SearchQA read the folder `path` (never vendored)."""
  counts = dict(num_documents=num_documents, num_validation=num_validation, num_test=num_test)
  if name == "medical":
    return medical_task(**{k: v for k, v in counts.items() if v is not None}, seed=seed)
  if name in ("movielens", "searchqa"):
    if not path:
      raise ValueError(f"The {name} task reads a local copy of the dataset: set its path "
                       "(it is never vendored, see README).")
    loader = movielens_task if name == "movielens" else searchqa_task
    return loader(path, **counts, seed=seed)
  raise ValueError(f"Unknown task {name!r}; expected medical, movielens or searchqa.")
