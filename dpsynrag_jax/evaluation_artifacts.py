"""Evaluation artifacts: reports that read a build's private state, kept apart from releases.

A build releases only its top-level files (synrag.workdir.RELEASED_FILES); its private state
lives under private/. Some tools read that state, or the documents' ground truth, and report
statistics of it: the funnel (cluster members, purity, coverage, decode fidelity), bench_build
(empty clusters, rows per cluster), decode_variants, sampling_support. Their figures are NOT
differentially private: harmless for a public benchmark corpus, a leak on real data. So every
such report goes under a folder named evaluation/, never beside released files:

    DIR/evaluation/funnel.json     the funnel of the build in DIR
    OUT/evaluation/NAME            a report of an evaluation work dir OUT

`check_destination` refuses a folder that holds released files (a build's top level, a
published result folder) or is one of their released subfolders; `write_json` / `write_text`
check, label the report (`label`, `markdown_header`) and print where it went; `announce`
prints the notice when a tool starts.
"""

from __future__ import annotations

import json
import os
import sys
from typing import TextIO

from dpsynrag_jax.synrag import workdir as wd_lib

EVALUATION = wd_lib.EVALUATION
FIELD = "evaluation_artifact"
NOTICE = ("Evaluation artifact: computed from private state (a build's private/ folder or the "
          "documents' ground truth); its figures are NOT differentially private and it is no "
          "part of any release. Publish it only for a public benchmark corpus.")


class EvaluationArtifactError(ValueError):
  """An evaluation report was about to be written beside released files."""


def evaluation_dir(root: str) -> str:
  """root/evaluation (root itself when it already is an evaluation/ folder)."""
  root = os.path.abspath(root)
  return root if os.path.basename(root) == EVALUATION else os.path.join(root, EVALUATION)


def evaluation_path(root: str, name: str) -> str:
  """Where the report `name` of the build (or evaluation work dir) in `root` goes."""
  return os.path.join(evaluation_dir(root), name)


def holds_released_files(folder: str) -> bool:
  """True if `folder` holds any file a build releases (config.json, synthetic_db.jsonl, ...)."""
  return any(os.path.exists(os.path.join(folder, n)) for n in wd_lib.RELEASED_FILES)


def check_destination(path: str) -> str:
  """The absolute `path` of an evaluation report; raises EvaluationArtifactError if its folder
  holds released files or is a released subfolder of one that does (e.g. a build's ledgers/)."""
  path = os.path.abspath(path)
  folder = os.path.dirname(path)
  parent = os.path.dirname(folder)
  released_subfolder = (os.path.basename(folder) in wd_lib.RELEASED_FILES and
                        holds_released_files(parent))
  if holds_released_files(folder) or released_subfolder:
    top = parent if released_subfolder else folder
    raise EvaluationArtifactError(
        f"{path} would sit beside released files: it is an evaluation artifact (reads private "
        f"state, not differentially private). Write it under "
        f"{evaluation_path(top, os.path.basename(path))} instead.")
  return path


def label(tool: str, reads: str) -> dict:
  """The field every JSON evaluation report carries (FIELD)."""
  return {"tool": tool, "reads": reads, "differentially_private": False, "notice": NOTICE}


def markdown_header(tool: str, reads: str) -> str:
  """The first lines of every markdown evaluation report."""
  return (f"> **Evaluation artifact** ({tool}): reads {reads}. Its figures are NOT "
          "differentially private and it is no part of any release; publish it only for a "
          "public benchmark corpus.\n\n")


def announce(tool: str, reads: str, file: TextIO | None = None) -> None:
  """Prints the notice when `tool` runs (stdout unless `file`, e.g. sys.stderr where stdout is
  the report itself)."""
  print(f"[{tool}] {NOTICE} It reads {reads}; reports go to an {EVALUATION}/ folder.",
        file=file or sys.stdout, flush=True)


def write_json(path: str, report: dict, tool: str, reads: str,
               file: TextIO | None = None) -> str:
  """Writes `report` to `path` (checked, atomic) with FIELD first; returns the path."""
  path = check_destination(path)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  labelled = {FIELD: label(tool, reads), **{k: v for k, v in report.items() if k != FIELD}}
  wd_lib.atomic_write_text(path, json.dumps(labelled, indent=1) + "\n")
  print(f"[{tool}] evaluation artifact written: {path}", file=file or sys.stdout, flush=True)
  return path


def write_text(path: str, text: str, tool: str, reads: str,
               file: TextIO | None = None) -> str:
  """Writes the markdown report `text` to `path` (checked, atomic) after markdown_header."""
  path = check_destination(path)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  wd_lib.atomic_write_text(path, markdown_header(tool, reads) + text)
  print(f"[{tool}] evaluation artifact written: {path}", file=file or sys.stdout, flush=True)
  return path

