"""A released synthetic database, opened for questions: search it, answer from it.

    db = SyntheticDatabase.load("runs/demo")          # released files only, never private/
    for hit in db.search("I have a rash and a fever. What is my disease?", k=5):
      print(f"{hit.score:.3f}  {hit.text}")
    print(db.answer("...", lm=load_lm("smollm2-135m-instruct")).text)

Everything here reads the release alone (synthetic_db.jsonl, index.faiss, config.json), so
asking costs no privacy: it is post-processing of the DP release. A folder without the index
(a release shared as texts only) gets it rebuilt from the texts with the build's encoder.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Sequence

import numpy as np

from dpsynrag_jax.rag import answer as rag_answer
from dpsynrag_jax.rag import index as rag_index

SYNTHETIC_DB = "synthetic_db.jsonl"
INDEX = "index.faiss"
CONFIG = "config.json"
DEFAULT_ENCODER = "all-minilm-l6-v2"


class DatabaseError(ValueError):
  """A folder that holds no released synthetic database, or one that does not fit together."""


@dataclasses.dataclass(frozen=True)
class Hit:
  """One retrieved synthetic text: its cosine score and the keyword of its cluster."""
  text: str
  score: float
  keyword: str = ""


@dataclasses.dataclass(frozen=True)
class Answer:
  """The reader's answer and the texts it read, best first."""
  text: str
  hits: tuple[Hit, ...]


class SyntheticDatabase:
  """The texts of a release with their index and the encoder that embeds questions."""

  def __init__(self, records: Sequence[dict], index, encoder, config: dict | None = None):
    if index.ntotal != len(records):
      raise DatabaseError(f"The index holds {index.ntotal} vectors for {len(records)} texts; "
                          "the release is inconsistent.")
    if records and index.d != encoder.dim:
      raise DatabaseError(f"The index has {index.d}-dimensional vectors but the encoder gives "
                          f"{encoder.dim}; pass the encoder the database was built with.")
    self.records = [dict(r) for r in records]
    self.index = index
    self.encoder = encoder
    self.config = config or {}

  @classmethod
  def load(cls, directory: str, encoder=None) -> "SyntheticDatabase":
    """Opens the release in `directory`. encoder: a loaded encoder, a name or path, or None
    for the one the build's config.json names. Raises DatabaseError for a folder without
    synthetic_db.jsonl."""
    db_path = os.path.join(directory, SYNTHETIC_DB)
    if not os.path.isfile(db_path):
      raise DatabaseError(f"{directory} holds no released synthetic database (no {SYNTHETIC_DB}"
                          "); pass the work dir of a finished build.")
    records = []
    with open(db_path, encoding="utf-8") as f:
      for n, line in enumerate(f, 1):
        if not line.strip():
          continue
        try:
          record = json.loads(line)
        except json.JSONDecodeError as e:
          raise DatabaseError(f"{db_path} line {n} is not JSON ({e.msg}).") from None
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
          raise DatabaseError(f"{db_path} line {n} has no \"text\" string.")
        records.append(record)
    config_path = os.path.join(directory, CONFIG)
    config = None
    if os.path.isfile(config_path):
      with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    if encoder is None or isinstance(encoder, (str, os.PathLike)):
      from dpsynrag_jax.models import load_encoder  # pylint: disable=g-import-not-at-top
      name = encoder or ((config or {}).get("model", {}).get("encoder") or DEFAULT_ENCODER)
      encoder = load_encoder(name)
    index_path = os.path.join(directory, INDEX)
    if os.path.isfile(index_path):
      index = rag_index.load_index(index_path)
    else:   # texts only: embed them again, as the build did
      texts = [r["text"] for r in records]
      vectors = (encoder.embed(texts) if texts else np.zeros((0, encoder.dim), np.float32))
      index = rag_index.build_index(vectors)
    return cls(records, index, encoder, config)

  def __len__(self) -> int:
    return len(self.records)

  def search(self, question: str, k: int = 10) -> list[Hit]:
    """The k texts nearest `question` (cosine of unit embeddings), best first."""
    return self.search_many([question], k)[0]

  def search_many(self, questions: Sequence[str], k: int = 10) -> list[list[Hit]]:
    if k < 1:
      raise ValueError(f"k must be at least 1, got {k}.")
    if not questions:
      return []
    scores, ids = rag_index.search(self.index, self.encoder.embed(list(questions)), k)
    return [[Hit(self.records[i]["text"], float(s), str(self.records[i].get("keyword", "")))
             for s, i in zip(row_scores, row_ids) if i >= 0]
            for row_scores, row_ids in zip(scores, ids)]

  def answer(self, question: str, lm, k: int = 10, *, reader: str = "focused",
             task: str | None = None, max_new_tokens: int = 48) -> Answer:
    """The greedy answer of `lm` (a LanguageModel) from the k nearest texts."""
    return self.answer_many([question], lm, k, reader=reader, task=task,
                            max_new_tokens=max_new_tokens)[0]

  def answer_many(self, questions: Sequence[str], lm, k: int = 10, *, reader: str = "focused",
                  task: str | None = None, max_new_tokens: int = 48) -> list[Answer]:
    hits = self.search_many(questions, k)
    texts = rag_answer.answer_questions(
        lm, list(questions), [[h.text for h in row] for row in hits],
        max_new_tokens=max_new_tokens, prompt=rag_answer.reader_prompt(reader, task))
    return [Answer(t, tuple(row)) for t, row in zip(texts, hits)]
