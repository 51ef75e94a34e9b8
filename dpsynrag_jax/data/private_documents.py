"""The private documents of a build, from a build config's `data` section.

data.name: medical_synth (vendored), movielens / searchqa (a local copy at data.path), or corpus
(the user's JSONL/CSV at data.path). Every document comes with a `where` string naming it for
error messages (never for a release).
"""

from __future__ import annotations

from typing import Sequence

from absl import logging

from dpsynrag_jax.data.tasks import TASK_OF_DATA


def load_private_documents(data_config) -> tuple[list[str], list[str]]:
  """(documents, where) with where[i] naming document i for error messages."""
  if data_config.name == "corpus":
    from dpsynrag_jax.data.corpus import load_corpus  # pylint: disable=g-import-not-at-top
    if not data_config.path:
      raise ValueError("data.name='corpus' needs --config.data.path=docs.jsonl (or .csv).")
    corpus = load_corpus(data_config.path, text_field=data_config.text_field)
    texts = list(corpus.texts)
    where = [f"{data_config.path} line {n}" for n in corpus.line_numbers]
    if data_config.num_documents:
      texts, where = texts[:data_config.num_documents], where[:data_config.num_documents]
    return texts, where
  if data_config.name not in TASK_OF_DATA:
    raise ValueError(f"Unknown data.name {data_config.name!r}; expected one of "
                     f"{sorted(TASK_OF_DATA) + ['corpus']}.")
  from dpsynrag_jax.data.tasks import load_task  # pylint: disable=g-import-not-at-top
  task = load_task(TASK_OF_DATA[data_config.name], path=data_config.path,
                   num_documents=data_config.num_documents or None, num_validation=0,
                   num_test=0, seed=data_config.split_seed)
  return list(task.documents), [f"{data_config.name} document {i}"
                                for i in range(len(task.documents))]


def fit_to_budget(lm, documents: Sequence[str], where: Sequence[str], max_tokens: int,
                  policy: str) -> list[str]:
  """Documents cut to max_tokens tokens ('truncate', counted in the log) or an error naming the
  first document over budget ('error')."""
  if policy not in ("truncate", "error"):
    raise ValueError(f"data.too_long must be 'truncate' or 'error', got {policy!r}.")
  out, truncated = [], 0
  for doc, ids, place in zip(documents, lm.encode(documents), where):
    if len(ids) <= max_tokens:
      out.append(doc)
      continue
    if policy == "error":
      raise ValueError(f"{place} has {len(ids)} tokens, over data.max_doc_tokens={max_tokens}; "
                       "raise the budget or set data.too_long='truncate'.")
    truncated += 1
    out.append(lm.decode(ids[:max_tokens]))
  if truncated:
    # A count about the private corpus: the operator's log only, never a released file.
    logging.info("Truncated %d documents to %d tokens.", truncated, max_tokens)
  return out
