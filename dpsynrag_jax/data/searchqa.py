"""SearchQA: Jeopardy! questions, with the Google snippets retrieved for them as the database.

SearchQA is for research use only, so nothing of it ships with this package: the loader reads a
folder the user names. It looks, in this order, for

    <path>/skillopt_split/{train,val,test}/items.json   (the offline copy's layout; the folder
    <path>/{train,val,test}/items.json                    `skillopt_split` itself may be named)
    <path>/*.json, *.json.gz, *.jsonl, *.jsonl.gz         (MRQA files, e.g. SearchQA.jsonl.gz)

and reads every file it finds there, in the order listed (names sorted in the last case). The
offline copy's `qa_only/` (no snippets) and `skillopt_split/id_manifest/` (ids only) are not
data files and are never read; a materialised `test/items.json` would be read too.

A .json file is one JSON array of records; a .jsonl file has one record per line, and a line
holding only a "header" object (MRQA's first line) is skipped. A record is either flat,
{"id" (or "key" / "qid"), "question", "context", "answers": [...]}, as in the offline copy, or
MRQA's {"context", "qas": [{"qid" (or "id"), "question", "answers"}, ...]}, one question per qa.

Documents: a context is split at "[DOC]"; each piece "[TLE] <title> [PAR] <text>" is one
snippet, and its document is "<title>\\n<text>" (just "<text>" without a title), with runs of
whitespace inside the title and the text collapsed to one space (the line breaks are the search
engine's wrapping). A piece with no text after [PAR] (the contexts were cut at ~4.6k characters
upstream, which leaves a bare title at the end) or with nothing at all is dropped and counted.
Duplicate snippets are kept: they are separate records, and the guarantee is per document.

Gold answers: each answer with the backslash before quotes removed ("Valentine\\'s Day" ->
"Valentine's Day"), whitespace collapsed, and one pair of enclosing double quotes removed; an
answer with an optional part in parentheses ("(The People's Republic of) China") also gives the
form without it ("China") and the one with the brackets dropped. An output counts as correct if
it contains any gold answer as whole words, ignoring case (`matchers.answer_contains_any`).
A snippet bears an answer (the selection below) if it contains one anywhere
(`answer_contains_any_substring`), the rule the builds were made with.

Selection: the paper kept questions with at least 40 answer-bearing snippets (102 questions,
7054 snippets); the offline copy has at most 21 snippets a question, so we keep the questions
with at least `min_answer_snippets` (default 1) snippets that contain a gold answer (the others
cannot be answered from the database), and drop the snippets of the others too.

Split: the kept questions, in reading order, are permuted once with
`numpy.random.default_rng(seed).permutation`; even positions form the validation pool, odd
positions the test pool. The database is the snippets of every kept question, question by
question in permutation order (the paper's database, too, holds the snippets of its query
questions; it used the same 102 questions for validation and test, ours are disjoint). Asking
for fewer documents or queries takes a prefix of its list, so a small run's data is a subset of a
big run's for the same seed and folder, and the first documents belong to the first queries of
both pools.

There are no personal identifiers here, hence no leakage names.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import re
from typing import Any, Iterator, Sequence

import numpy as np

from dpsynrag_jax.data.counts import check_count
from dpsynrag_jax.data.matchers import (answer_contains_any, answer_contains_any_substring,
                                       collapse_whitespace)
from dpsynrag_jax.data.tasks import Task, TaskQuery

SNIPPET_MARKER = "[DOC]"
TITLE_MARKER = "[TLE]"
TEXT_MARKER = "[PAR]"

SPLIT_DIRS = ("train", "val", "test")
_SUFFIXES = (".json", ".json.gz", ".jsonl", ".jsonl.gz")


class SearchQAError(ValueError):
  """The SearchQA folder is missing, of an unknown layout, or a file breaks its format."""


@dataclasses.dataclass(frozen=True)
class _Question:
  question_id: str
  text: str
  answers: list[str]
  snippets: list[tuple[str, str]]   # (title, text)
  dropped_snippets: int


# ---------------------------------------------------------------- answers


def gold_answers(raw: Sequence[str]) -> list[str]:
  """The cleaned gold answers of one question (module docstring), in order, without repeats."""
  result: list[str] = []

  def add(text: str) -> None:
    text = collapse_whitespace(text)
    if text and text not in result:
      result.append(text)

  for answer in raw:
    text = collapse_whitespace(re.sub(r"\\(['\"])", r"\1", answer))
    if len(text) > 2 and text.startswith('"') and text.endswith('"'):
      text = text[1:-1]
    add(text)
    if re.search(r"\([^()]*\)", text):
      add(re.sub(r"\([^()]*\)", " ", text))
      add(re.sub(r"[()]", "", text))
  return result


# ---------------------------------------------------------------- snippets


def split_snippets(context: str, where: str = "context") -> tuple[list[tuple[str, str]], int]:
  """The (title, text) snippets of an MRQA context, and the number of pieces dropped for having
  no text. `where` names the record in errors."""
  head, *pieces = context.split(SNIPPET_MARKER)
  if not pieces:
    raise SearchQAError(f"{where}: the context has no {SNIPPET_MARKER} marker; expected MRQA "
                        f"snippets '{SNIPPET_MARKER} {TITLE_MARKER} title {TEXT_MARKER} text'.")
  if head.strip():
    raise SearchQAError(f"{where}: the context has text before its first {SNIPPET_MARKER}: "
                        f"{head.strip()[:60]!r}.")
  snippets, dropped = [], 0
  for piece in pieces:
    piece = piece.strip()
    title = ""
    if piece.startswith(TITLE_MARKER):
      title, _, piece = piece[len(TITLE_MARKER):].partition(TEXT_MARKER)
    else:
      piece = piece.removeprefix(TEXT_MARKER)
    # A second [PAR] (not seen in SearchQA) would only separate paragraphs of one snippet.
    text = collapse_whitespace(piece.replace(TEXT_MARKER, " "))
    if not text:
      dropped += 1
      continue
    snippets.append((collapse_whitespace(title), text))
  return snippets, dropped


def snippet_document(title: str, text: str) -> str:
  """The database document of one snippet: "<title>\\n<text>", or "<text>" without a title."""
  return f"{title}\n{text}" if title else text


# ---------------------------------------------------------------- files


def find_files(path: str | os.PathLike) -> list[str]:
  """The data files under `path`, in reading order (module docstring)."""
  path = os.fspath(path)
  if not os.path.exists(path):
    raise SearchQAError(f"SearchQA path {path} does not exist.")
  if os.path.isfile(path):
    return [path]
  root = os.path.join(path, "skillopt_split")
  if not os.path.isdir(root):
    root = path
  files = [os.path.join(root, s, "items.json") for s in SPLIT_DIRS]
  files = [f for f in files if os.path.isfile(f)]
  if files:
    return files
  files = sorted(os.path.join(root, f) for f in os.listdir(root)
                 if f.endswith(_SUFFIXES) and os.path.isfile(os.path.join(root, f)))
  if files:
    return files
  raise SearchQAError(
      f"{path} holds no SearchQA files; expected skillopt_split/{{train,val,test}}/items.json, "
      f"{{train,val,test}}/items.json, or MRQA files ({', '.join(_SUFFIXES)}) in the folder.")


def _open_text(path: str):
  if path.endswith(".gz"):
    return gzip.open(path, "rt", encoding="utf-8")
  return open(path, encoding="utf-8")


def _raw_records(path: str) -> Iterator[tuple[str, Any]]:
  """(location for errors, decoded JSON value) for every record of one file."""
  try:
    with _open_text(path) as f:
      if path.endswith((".jsonl", ".jsonl.gz")):
        for n, line in enumerate(f, start=1):
          if not line.strip():
            continue
          try:
            value = json.loads(line)
          except json.JSONDecodeError as e:
            raise SearchQAError(f"{path}, line {n}: malformed JSON ({e.msg}).") from None
          if isinstance(value, dict) and "header" in value and "context" not in value:
            continue
          yield f"{path}, line {n}", value
        return
      try:
        data = json.load(f)
      except json.JSONDecodeError as e:
        raise SearchQAError(f"{path}, line {e.lineno}, column {e.colno}: malformed JSON "
                            f"({e.msg}).") from None
  except (UnicodeDecodeError, gzip.BadGzipFile, EOFError) as e:
    raise SearchQAError(f"{path}: cannot be read as UTF-8 JSON ({e}).") from None
  if not isinstance(data, list):
    raise SearchQAError(f"{path}: expected a JSON array of records, got a "
                        f"{type(data).__name__}.")
  for i, value in enumerate(data, start=1):
    yield f"{path}, record {i}", value


def _field(where: str, obj: Any, names: Sequence[str], kind: type) -> Any:
  """The first of `names` present in `obj`, checked to be of `kind`."""
  if not isinstance(obj, dict):
    raise SearchQAError(f"{where}: expected a JSON object, got {type(obj).__name__}.")
  for name in names:
    if name in obj:
      value = obj[name]
      if kind is str and isinstance(value, int) and not isinstance(value, bool):
        value = str(value)  # numeric question ids
      if not isinstance(value, kind):
        raise SearchQAError(f"{where}: field {name!r} must be a {kind.__name__}, got "
                            f"{type(value).__name__}.")
      return value
  raise SearchQAError(f"{where}: no {' / '.join(repr(n) for n in names)} field (fields: "
                      f"{', '.join(sorted(obj)) or 'none'}).")


def _question(where: str, qa: dict, context: str) -> _Question:
  qid = _field(where, qa, ("id", "key", "qid"), str)
  text = collapse_whitespace(_field(where, qa, ("question",), str))
  raw = _field(where, qa, ("answers",), list)
  if not all(isinstance(a, str) for a in raw):
    raise SearchQAError(f"{where}: 'answers' must be a list of strings.")
  answers = gold_answers(raw)
  if not text:
    raise SearchQAError(f"{where}: empty question.")
  if not answers:
    raise SearchQAError(f"{where}: no non-empty answer.")
  snippets, dropped = split_snippets(context, where)
  return _Question(question_id=qid, text=text, answers=answers, snippets=snippets,
                   dropped_snippets=dropped)


def read_questions(files: Sequence[str]) -> list[_Question]:
  """Every question of `files`, in reading order; an id seen twice is an error."""
  questions, seen = [], {}
  for path in files:
    for where, obj in _raw_records(path):
      context = _field(where, obj, ("context",), str)
      qas = [obj] if not (isinstance(obj, dict) and "qas" in obj) else _field(
          where, obj, ("qas",), list)
      for qa in qas:
        q = _question(where, qa, context)
        if q.question_id in seen:
          raise SearchQAError(f"{where}: question id {q.question_id!r} already seen at "
                              f"{seen[q.question_id]}.")
        seen[q.question_id] = where
        questions.append(q)
  if not questions:
    raise SearchQAError(f"No questions in {', '.join(files)}.")
  return questions


# ---------------------------------------------------------------- selection and split


def _answer_snippets(q: _Question) -> int:
  return sum(answer_contains_any_substring(snippet_document(*s), q.answers) for s in q.snippets)


def load_searchqa(path: str | os.PathLike, *, num_documents: int | None = None,
                  num_validation: int | None = None, num_test: int | None = None,
                  seed: int = 0, min_answer_snippets: int = 1) -> Task:
  """The first `num_*` items of each list for `seed` (None: all of it), from the SearchQA folder
  (or file) `path`. Raises SearchQAError for a missing path, no data file, or a malformed file,
  line or record (naming it).

  Document i is snippet i; doc_sources[i] is the question it was retrieved for (evaluation
  only) and a query's source its question id. provenance: "files" read, in order;
  "doc_titles" (each snippet's page title, "" if none); "dropped_questions" (under
  `min_answer_snippets`) and "dropped_snippets" (pieces without text among the kept
  questions' snippets).
  """
  if (isinstance(min_answer_snippets, bool) or not isinstance(min_answer_snippets, int)
      or min_answer_snippets < 0):
    raise ValueError(f"min_answer_snippets must be an int >= 0, got {min_answer_snippets!r}.")
  files = find_files(path)
  questions = read_questions(files)
  kept = [q for q in questions if _answer_snippets(q) >= min_answer_snippets]
  order = [kept[int(i)] for i in np.random.default_rng(seed).permutation(len(kept))]
  validation, test = order[0::2], order[1::2]
  validation = validation[:check_count("num_validation", num_validation, len(validation))]
  test = test[:check_count("num_test", num_test, len(test))]
  pairs = [(q.question_id, s) for q in order for s in q.snippets]
  pairs = pairs[:check_count("num_documents", num_documents, len(pairs))]

  def queries(qs: list[_Question]) -> tuple[TaskQuery, ...]:
    return tuple(TaskQuery(text=q.text, answers=tuple(q.answers), source=q.question_id)
                 for q in qs)

  return Task(
      "searchqa", tuple(snippet_document(*s) for _, s in pairs), (), queries(validation),
      queries(test), answer_contains_any, None, 10, doc_sources=tuple(qid for qid, _ in pairs),
      seed=int(seed),
      provenance={"files": list(files), "doc_titles": [s[0] for _, s in pairs],
                  "dropped_questions": len(questions) - len(kept),
                  "dropped_snippets": sum(q.dropped_snippets for q in kept)})
