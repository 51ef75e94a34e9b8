"""A task: private documents, held-out questions with gold answers, and how answers are scored.

One data model for every dataset: each loader (medical_synth, movielens, searchqa) builds a Task,
and every method of the evaluation (RAG, DP-SynRAG, the baselines) reads one, so one harness runs
any method on any dataset. Only `documents` is private input to a method; the per-document
fields beside it (answers, subjects, sources) are evaluation ground truth, and `private_names`
are the identifiers the leakage metric looks for.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Hashable, Mapping, Sequence

from dpsynrag_jax.data import matchers


@dataclasses.dataclass(frozen=True)
class TaskQuery:
  """One question: `text` goes to the method, the rest to the metric and to tests only."""
  text: str
  answers: tuple[str, ...]   # any of them counts
  subject: str = ""          # the held-out person asked about (patient, user pseudonym), or ""
  source: Hashable = ""      # the question's id in the dataset (patient, user id, question id)


@dataclasses.dataclass(frozen=True)
class Task:
  """documents[i], doc_answers[i], doc_subjects[i] and doc_sources[i] describe document i."""
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
  # The person each document describes (patient, user pseudonym); () when none.
  doc_subjects: tuple[str, ...] = ()
  # Each document's id in the dataset (patient, MovieLens user id, SearchQA question id).
  doc_sources: tuple[Hashable, ...] = ()
  # The dataset's answer list (Medical's public diseases; MovieLens' top movies, counted over
  # every rating, so for evaluation and reports only).
  answer_names: tuple[str, ...] = ()
  seed: int = 0                           # the split's seed
  # What loading read and left out (layout, files, dropped records, per-document extras).
  provenance: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  def document_answers(self) -> list[tuple[str, ...]]:
    """Per document, the test answers it holds (ground truth for evaluation only)."""
    if self.doc_answers:
      return [tuple(a) for a in self.doc_answers]
    vocabulary = sorted({a for q in self.test for a in q.answers})
    return [tuple(a for a in vocabulary if self.matches(doc, [a])) for doc in self.documents]


# A build config's data.name for each task, and back: the Medical task's data is
# "medical_synth" (the dataset's own name); the other two share their names.
DATA_OF_TASK = {"medical": "medical_synth", "movielens": "movielens", "searchqa": "searchqa"}
TASK_OF_DATA = {**{data: task for task, data in DATA_OF_TASK.items()}, "medical": "medical"}


def load_task(name: str, *, path: str = "", num_documents=None, num_validation=None,
              num_test=None, seed: int = 0) -> Task:
  """The task `name`; MovieLens and SearchQA read the folder `path` (never vendored)."""
  # Loaders are imported here: each imports Task from this module.
  # pylint: disable=g-import-not-at-top
  counts = dict(num_documents=num_documents, num_validation=num_validation, num_test=num_test)
  if name == "medical":
    from dpsynrag_jax.data.medical_synth import load_medical_synth
    return load_medical_synth(**{k: v for k, v in counts.items() if v is not None}, seed=seed)
  if name in ("movielens", "searchqa"):
    if not path:
      raise ValueError(f"The {name} task reads a local copy of the dataset: set its path "
                       "(it is never vendored, see README).")
    if name == "movielens":
      from dpsynrag_jax.data.movielens import load_movielens as loader
    else:
      from dpsynrag_jax.data.searchqa import load_searchqa as loader
    return loader(path, **counts, seed=seed)
  raise ValueError(f"Unknown task {name!r}; expected medical, movielens or searchqa.")
