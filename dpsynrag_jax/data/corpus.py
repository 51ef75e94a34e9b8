"""Loading a user's private document collection from JSONL or CSV.

Supported files (the format follows the extension, case-insensitive, or `file_format`):

    .jsonl / .ndjson   one JSON object per line, the document in `text_field`
    .csv               a header row, then one row per document, the document in column `text_field`
    .tsv               the same with tab separators

Every irregularity either follows a stated policy, counted in the report, or raises CorpusError
naming the file and the (1-based) line:

    blank line, or a text that is empty or whitespace only     on_empty: "skip" (default) | "error"
    the same text twice (after stripping and truncation)       on_duplicate: "keep" (default) |
                                                                 "skip" | "error"
    bytes that are not UTF-8                                   on_bad_utf8: "error" (default) |
                                                                 "replace" (U+FFFD) | "skip"
    a text longer than `max_chars` characters                  truncated to max_chars, counted
    malformed JSON; a line that is not an object, lacks the
    field, or whose field is not a string                      error
    a CSV row with a different number of fields than the
    header; a header without the column or with it twice      error
    an empty file, or no document left after the policies     error
    an unknown extension                                       error listing the supported ones

Duplicates are kept by default: the guarantee is per document (neighbouring corpora differ by one
document), and two people may well write the same text. Pass "skip" when a duplicate more likely
means one person's record copied twice, which would otherwise count that person twice.

Texts are stripped of surrounding whitespace; nothing else is changed. A UTF-8 byte order mark at
the start of the file is dropped (spreadsheet programs write one). `max_chars` is a coarse guard
only: the pipeline truncates to its prompt budget in tokens later.

The report's counts describe the PRIVATE corpus. They are for the operator's log; never write
them (or the line numbers) into released files.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import json
import logging
import os
from typing import Iterator

SUPPORTED_EXTENSIONS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".tsv": "tsv"}

_ON_EMPTY = ("skip", "error")
_ON_DUPLICATE = ("keep", "skip", "error")
_ON_BAD_UTF8 = ("error", "replace", "skip")

# Big enough for any document, small enough for a C long on every platform.
_CSV_FIELD_LIMIT = 2**31 - 1


class CorpusError(ValueError):
  """The corpus file breaks a rule of its format or a policy set to "error"."""


@dataclasses.dataclass(frozen=True)
class CorpusReport:
  """What loading did. Private: for the operator's log only, never for released files.

  records: non-blank lines (JSONL) or data rows (CSV) read, kept or not.
  """
  path: str
  file_format: str
  records: int = 0
  kept: int = 0
  skipped_empty: int = 0
  skipped_duplicates: int = 0
  kept_duplicates: int = 0
  replaced_bad_utf8: int = 0
  skipped_bad_utf8: int = 0
  truncated: int = 0

  def summary(self) -> str:
    return (f"Loaded {self.kept} documents from {self.path} ({self.file_format}, {self.records} "
            f"records): skipped {self.skipped_empty} empty, {self.skipped_duplicates} duplicate, "
            f"{self.skipped_bad_utf8} non-UTF-8; kept {self.kept_duplicates} duplicate; replaced "
            f"bad bytes in {self.replaced_bad_utf8}; truncated {self.truncated}.")


@dataclasses.dataclass(frozen=True)
class Corpus:
  """texts[i] is the document that starts on line line_numbers[i] (1-based) of the file."""
  texts: list[str]
  line_numbers: list[int]
  report: CorpusReport


def _choose(name: str, value: str, allowed: tuple[str, ...]) -> None:
  if value not in allowed:
    raise ValueError(f"{name} must be one of {allowed}, got {value!r}.")


def _detect_format(path: str, file_format: str | None) -> str:
  if file_format is not None:
    _choose("file_format", file_format, tuple(sorted(set(SUPPORTED_EXTENSIONS.values()))))
    return file_format
  ext = os.path.splitext(path)[1].lower()
  if ext not in SUPPORTED_EXTENSIONS:
    raise CorpusError(f"{path}: unknown extension {ext!r}; supported: "
                      f"{', '.join(sorted(SUPPORTED_EXTENSIONS))} (or pass file_format).")
  return SUPPORTED_EXTENSIONS[ext]


class _Lines:
  """Decodes a binary file line by line, remembering which lines held bad UTF-8.

  Iterating yields decoded lines with their line endings (what csv.reader expects); bad bytes are
  replaced by U+FFFD unless the policy is "error", which raises at the offending line.
  """

  def __init__(self, path: str, f, on_bad_utf8: str):
    self.path, self._f, self._policy = path, f, on_bad_utf8
    self.line_number = 0
    self.bad_lines: set[int] = set()

  def __iter__(self) -> Iterator[str]:
    for raw in self._f:  # binary iteration splits on b"\n" only, keeping it
      self.line_number += 1
      if self.line_number == 1 and raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
      try:
        line = raw.decode("utf-8")
      except UnicodeDecodeError as e:
        if self._policy == "error":
          raise CorpusError(
              f"{self.path}, line {self.line_number}: bytes that are not UTF-8 at byte "
              f"{e.start} of the line ({e.reason}); re-encode the file or pass "
              "on_bad_utf8='replace' or 'skip'.") from None
        self.bad_lines.add(self.line_number)
        line = raw.decode("utf-8", errors="replace")
      yield line


def _jsonl_records(lines: _Lines, path: str,
                   text_field: str) -> Iterator[tuple[int, int, str | None]]:
  """(first line, last line, text or None for a blank line) per line."""
  for line in lines:
    n = lines.line_number
    if not line.strip():
      yield n, n, None
      continue
    try:
      obj = json.loads(line)
    except json.JSONDecodeError as e:
      raise CorpusError(
          f"{path}, line {n}: malformed JSON ({e.msg} at column {e.colno}).") from None
    if not isinstance(obj, dict):
      raise CorpusError(f"{path}, line {n}: expected a JSON object with a {text_field!r} field, "
                        f"got a JSON {type(obj).__name__}.")
    if text_field not in obj:
      keys = ", ".join(repr(k) for k in list(obj)[:10])
      raise CorpusError(f"{path}, line {n}: the object has no {text_field!r} field (its fields: "
                        f"{keys or 'none'}); set text_field.")
    text = obj[text_field]
    if not isinstance(text, str):
      raise CorpusError(f"{path}, line {n}: field {text_field!r} must be a string, got "
                        f"{type(text).__name__}.")
    yield n, n, text


def _csv_records(lines: _Lines, path: str, text_field: str,
                 delimiter: str) -> Iterator[tuple[int, int, str | None]]:
  """(first line, last line, text or None for a blank line) per data row."""
  # strict: an unterminated quote raises instead of swallowing the rest of the file.
  reader = csv.reader(lines, delimiter=delimiter, strict=True)
  header: list[str] | None = None
  first = 1
  while True:
    try:
      row = next(reader)
    except StopIteration:
      return
    except csv.Error as e:
      raise CorpusError(f"{path}, line {first}: malformed CSV ({e}; the row starting here was "
                        f"read up to line {reader.line_num}).") from None
    last = reader.line_num
    if header is None:
      header = row
      if not header:
        raise CorpusError(f"{path}, line 1: expected a header row, got a blank line.")
      if header.count(text_field) != 1:
        problem = "more than one" if text_field in header else "no"
        raise CorpusError(f"{path}, line 1: the header has {problem} column {text_field!r} "
                          f"(columns: {', '.join(repr(h) for h in header)}); set text_field.")
      column = header.index(text_field)
    elif not row or (len(row) == 1 and not row[0].strip()):
      yield first, last, None
    elif len(row) != len(header):
      # A stray delimiter or quote shifts columns: reading on would take the wrong text.
      raise CorpusError(f"{path}, line {first}: the row has {len(row)} fields, the header has "
                        f"{len(header)}; check quoting.")
    else:
      yield first, last, row[column]
    first = last + 1


@contextlib.contextmanager
def _csv_field_limit(limit: int):
  """Lifts csv's 128 KiB field limit (long documents are legitimate), then restores it."""
  old = csv.field_size_limit(limit)
  try:
    yield
  finally:
    csv.field_size_limit(old)


def load_corpus(path: str | os.PathLike, *, text_field: str = "text",
                max_chars: int | None = None, on_empty: str = "skip",
                on_duplicate: str = "keep", on_bad_utf8: str = "error",
                file_format: str | None = None) -> Corpus:
  """Reads the documents of a JSONL or CSV file under the policies of the module docstring.

  Logs one summary line (counts only, no text) and returns the texts with their line numbers and
  the report. Raises CorpusError for the errors listed in the module docstring.
  """
  path = os.fspath(path)
  _choose("on_empty", on_empty, _ON_EMPTY)
  _choose("on_duplicate", on_duplicate, _ON_DUPLICATE)
  _choose("on_bad_utf8", on_bad_utf8, _ON_BAD_UTF8)
  if max_chars is not None and (isinstance(max_chars, bool) or not isinstance(max_chars, int)
                                or max_chars < 1):
    raise ValueError(f"max_chars must be None or a positive int, got {max_chars!r}.")
  fmt = _detect_format(path, file_format)
  if os.path.isdir(path):
    raise CorpusError(f"{path} is a folder, expected a {fmt} file.")
  if os.path.getsize(path) == 0:
    raise CorpusError(f"{path} is empty.")

  counts = dict.fromkeys(("records", "skipped_empty", "skipped_duplicates", "kept_duplicates",
                          "replaced_bad_utf8", "skipped_bad_utf8", "truncated"), 0)
  texts, line_numbers, seen = [], [], {}
  with open(path, "rb") as f, _csv_field_limit(_CSV_FIELD_LIMIT):
    lines = _Lines(path, f, on_bad_utf8)
    if fmt == "jsonl":
      records = _jsonl_records(lines, path, text_field)
    else:
      records = _csv_records(lines, path, text_field, "\t" if fmt == "tsv" else ",")
    for first, last, text in records:
      # Blank lines are layout, not records: they count as skipped empties but not as records.
      if text is not None:
        counts["records"] += 1
      if any(n in lines.bad_lines for n in range(first, last + 1)):
        if on_bad_utf8 == "skip":
          counts["skipped_bad_utf8"] += 1
          continue
        counts["replaced_bad_utf8"] += 1
      text = (text or "").strip()
      if not text:
        if on_empty == "error":
          raise CorpusError(f"{path}, line {first}: empty document; remove the line or pass "
                            "on_empty='skip'.")
        counts["skipped_empty"] += 1
        continue
      if max_chars is not None and len(text) > max_chars:
        text = text[:max_chars].rstrip()
        counts["truncated"] += 1
      if text in seen:
        if on_duplicate == "error":
          raise CorpusError(f"{path}, line {first}: duplicate of the document on line "
                            f"{seen[text]}; pass on_duplicate='keep' or 'skip'.")
        if on_duplicate == "skip":
          counts["skipped_duplicates"] += 1
          continue
        counts["kept_duplicates"] += 1
      else:
        seen[text] = first
      texts.append(text)
      line_numbers.append(first)

  report = CorpusReport(path=path, file_format=fmt, kept=len(texts), **counts)
  if not texts:
    raise CorpusError(f"{path}: no documents left. {report.summary()}")
  logging.info("%s", report.summary())
  return Corpus(texts=texts, line_numbers=line_numbers, report=report)
