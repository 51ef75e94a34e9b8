"""The work directory of a build: released files at the top, resumable state under private/.

    DIR/config.json            the run's config (public)
    DIR/synthetic_db.jsonl     released: {"text", "keyword"} per synthetic text
    DIR/index.faiss            released: embeddings of the synthetic texts
    DIR/privacy_ledger.json    released: every mechanism run, its parameters and cost
    DIR/partitions.json        released after an append (synrag.refresh): every partition's
                               spend and the per-document guarantee
    DIR/ledgers/               released after an append: each partition's privacy ledger
    DIR/private/               state to resume; holds private data, NEVER part of a release

Writes are atomic (temp file + rename) and appends are flushed and fsynced, so a killed run
leaves either the old or the new version of a file, never half of one.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from typing import Any, Iterable

import numpy as np

from dpsynrag_jax import digests

CONFIG = "config.json"
SYNTHETIC_DB = "synthetic_db.jsonl"
INDEX = "index.faiss"
LEDGER = "privacy_ledger.json"
PARTITIONS = "partitions.json"
LEDGERS = "ledgers"
PRIVATE = "private"
NOISE_SEED = "noise_seed.json"   # under PRIVATE: the secret noise seed (privacy.keys)
DOCUMENT_DIGESTS = "document_digests.txt"   # private/: one sha256 per document, in order
RELEASED_FILES = (CONFIG, SYNTHETIC_DB, INDEX, LEDGER, PARTITIONS, LEDGERS)


class WorkdirError(RuntimeError):
  """The work directory is in a state the requested run cannot continue from."""


def atomic_write_text(path: str, text: str) -> None:
  tmp = f"{path}.tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    f.write(text)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


def atomic_write_json(path: str, obj: Any) -> None:
  atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def read_json(path: str) -> Any:
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def atomic_save_npy(path: str, array: np.ndarray) -> None:
  tmp = f"{path}.tmp.npy"
  np.save(tmp, array)
  os.replace(tmp, path)


def append_jsonl(path: str, records: Iterable[dict]) -> None:
  with open(path, "a", encoding="utf-8") as f:
    for r in records:
      f.write(json.dumps(r, sort_keys=True) + "\n")
    f.flush()
    os.fsync(f.fileno())


def read_jsonl(path: str) -> list[dict]:
  """Records of a JSONL file; a torn last line (a kill mid-append) is dropped."""
  if not os.path.exists(path):
    return []
  out = []
  with open(path, encoding="utf-8") as f:
    lines = f.read().split("\n")
  for i, line in enumerate(lines):
    if not line.strip():
      continue
    try:
      out.append(json.loads(line))
    except json.JSONDecodeError:
      if i == len(lines) - 1:  # only the unterminated last line can be torn
        break
      raise
  return out


class Workdir:
  """Paths and state files of one build."""

  def __init__(self, root: str):
    self.root = root
    self.private = os.path.join(root, PRIVATE)

  def path(self, name: str) -> str:
    return os.path.join(self.root, name)

  def private_path(self, name: str) -> str:
    return os.path.join(self.private, name)

  @property
  def finished(self) -> bool:
    return os.path.exists(self.private_path("FINISHED"))

  def prepare(self, config_dict: dict, overwrite: bool) -> bool:
    """Creates or reopens the directory. Returns True when resuming an interrupted run.

    A finished run is refused unless `overwrite`; an interrupted one resumes only with the
    same config (another config would mix two runs' randomness and ledgers). In seeded noise
    mode (privacy.noise), `overwrite` needs a seed other than the old build's: with the same
    seed the new build would draw the same noise as the old one (keyed draws), and two releases
    sharing noise on changed data or settings let the noise be subtracted. A new seed gives
    independent noise; the old release, if it was ever published, is still out there and its
    budget still counts. In secret mode clear() removes the old secret and the new build draws
    its own.
    """
    config_path = self.path(CONFIG)
    if os.path.exists(config_path) and overwrite:
      old_seed = read_json(config_path).get("seed")
      seeded = config_dict.get("privacy", {}).get("noise", "seeded") == "seeded"
      # Secret noise: clear() removes the old secret and the new build draws its own.
      if seeded and old_seed == config_dict.get("seed"):
        raise WorkdirError(
            f"{self.root} holds a build with seed {old_seed}; overwriting it with the same seed "
            "would release new outputs with the same noise as the old ones. Pass a new "
            "--config.seed, or delete the work dir if nothing of the old build was released.")
      self.clear()
    os.makedirs(self.private, exist_ok=True)
    if self.finished:
      raise WorkdirError(
          f"{self.root} holds a finished run; pass a new --workdir, or --config.runtime."
          "overwrite=True with a new --config.seed to build again.")
    if os.path.exists(config_path):
      if comparable_config(read_json(config_path)) != comparable_config(config_dict):
        raise WorkdirError(
            f"{self.root} holds an interrupted run with a different config; resume it with the "
            "same config, or start over in a new work dir.")
      atomic_write_json(config_path, config_dict)  # runtime knobs may differ
      return True
    atomic_write_json(config_path, config_dict)
    return False

  def clear(self) -> None:
    """Removes the released files (those of appended partitions too) and all private state."""
    for name in RELEASED_FILES:
      path = self.path(name)
      if os.path.isdir(path):
        shutil.rmtree(path)
      elif os.path.exists(path):
        os.remove(path)
    if os.path.isdir(self.private):
      shutil.rmtree(self.private)

  def holds_finished(self, config_dict: dict) -> bool:
    """A finished run of this config (runtime knobs aside) is here and can be reused."""
    return self.finished and (comparable_config(read_json(self.path(CONFIG))) ==
                              comparable_config(config_dict))

  def mark_finished(self) -> None:
    atomic_write_text(self.private_path("FINISHED"), "")

  # ---- private state of a build: what resumes it -----------------------------------------

  def check_documents(self, documents) -> None:
    """Records the private documents' digests; refuses to resume over other documents.

    Cached keywords, embeddings and cluster members are matched to documents by position: a
    corpus edited between an interruption and its resume would mix two datasets, and a person
    could land in 2L clusters. The per-document digests let a later append (synrag.refresh)
    refuse documents already built. Both are private state (they identify the corpus).
    """
    path = self.private_path("documents.sha256")
    digest = digests.sequence_sha256(documents)
    if os.path.exists(path):
      with open(path, encoding="utf-8") as f:
        recorded = f.read().strip()
      if recorded != digest:
        raise WorkdirError(
            f"{self.root} holds a build of other documents than the ones loaded now (the corpus "
            "changed since it was started); resume with the same documents, or start a new "
            "work dir.")
    else:
      atomic_write_text(path, digest + "\n")
    if self.document_digests() is None:
      atomic_write_text(self.private_path(DOCUMENT_DIGESTS),
                        "".join(d + "\n" for d in digests.text_sha256s(documents)))

  def document_digests(self) -> list[str] | None:
    """The per-document digests the build recorded, or None for a build that predates them."""
    path = self.private_path(DOCUMENT_DIGESTS)
    if not os.path.exists(path):
      return None
    with open(path, encoding="utf-8") as f:
      return f.read().split()

  def selected(self) -> dict[int, np.ndarray]:
    """cluster -> S_r (document indices) for every cluster re-ranked so far."""
    return {rec["cluster"]: np.asarray(rec["members"], np.int64)
            for rec in read_jsonl(self.private_path("selected.jsonl"))}

  def add_selected(self, members: dict[int, Iterable[int]]) -> None:
    append_jsonl(self.private_path("selected.jsonl"),
                 [{"cluster": r, "members": np.asarray(m).tolist()} for r, m in members.items()])

  @staticmethod
  def _generated_name(process: int) -> str:
    # Process 0 keeps the single-process name, so a resumed run reads it either way.
    return "generated.jsonl" if process == 0 else f"generated.p{process}.jsonl"

  def generated(self, process: int = 0) -> dict[int, list[int]]:
    """cluster -> token ids, for the clusters process `process` has decoded so far."""
    return {rec["cluster"]: rec["tokens"]
            for rec in read_jsonl(self.private_path(self._generated_name(process)))}

  def add_generated(self, process: int, tokens: dict[int, list[int]]) -> None:
    append_jsonl(self.private_path(self._generated_name(process)),
                 [{"cluster": r, "tokens": t} for r, t in tokens.items()])


# Options added to the build config after builds were made, with the value that means "off".
# A config holding one at its off value is the same build as one written before the option
# existed, so adding an option never invalidates finished or interrupted builds. Register every
# new build option here with its off value.
OPTIONAL_FIELDS = {
    ("privacy", "noise"): "seeded",      # how builds drew noise before the option existed
    ("clustering", "merge_synonyms"): 0.0,
    ("generation", "candidates"): 0,
    ("generation", "candidate_terms"): "",
    ("generation", "candidate_width"): 0.0,
    ("generation", "min_length"): 0,
    ("generation", "public_hint"): "",
    ("generation", "svt_paid"): 0,
    ("generation", "svt_threshold"): 1.0,
    ("generation", "svt_share"): 0.5,
}
# Fields that may differ between an interrupted run and its resume (how, not what, is built).
_RUNTIME_ONLY = (("runtime", "overwrite"), ("runtime", "stop_after_clusters"),
                 ("runtime", "stop_after_rerank"))


def comparable_config(config_dict: dict) -> dict:
  """The part of a build config that decides what is built: runtime knobs and options at their
  off value (OPTIONAL_FIELDS) left out."""
  out = json.loads(json.dumps(config_dict))
  for (section, name) in _RUNTIME_ONLY:
    out.get(section, {}).pop(name, None)
  for (section, name), off in OPTIONAL_FIELDS.items():
    if section in out and name in out[section] and out[section][name] == off:
      del out[section][name]
  return out


def config_digest(config_dict: dict) -> str:
  """12 hex digits naming what a build config builds (comparable_config): equal for a config
  and its resume, and for configs that differ only by options at their off value."""
  text = json.dumps(comparable_config(config_dict), sort_keys=True)
  return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]
