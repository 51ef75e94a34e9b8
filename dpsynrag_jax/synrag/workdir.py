"""The work directory of a build: released files at the top, resumable state under private/.

    DIR/config.json            the run's config (public)
    DIR/synthetic_db.jsonl     released: {"text", "keyword"} per synthetic text
    DIR/index.faiss            released: embeddings of the synthetic texts
    DIR/privacy_ledger.json    released: every mechanism run, its parameters and cost
    DIR/partitions.json        released after an append (synrag.refresh): every partition's
                               spend and the per-document guarantee
    DIR/ledgers/               released after an append: each partition's privacy ledger
    DIR/private/               state to resume; holds private data, NEVER part of a release;
                               owner-only (0700)
    DIR/private/build.lock     held (flock) by the one process building or appending here
    DIR/evaluation/            reports that read private state (funnels): NOT released, not DP

Writes are atomic (temp file + rename) and appends are flushed and fsynced, so a killed run
leaves either the old or the new version of a file, never half of one.

One build per work dir: `BuildLock` holds an exclusive lock on private/build.lock for the whole
build (or append). Two builds in one dir would both write every cluster, and with secret noise
two noisy copies of each; a second start is refused at once, naming the holder. The lock is the
kernel's (flock), so a build killed with SIGKILL leaves no stale lock: its resume takes it.
"""

from __future__ import annotations

import datetime
import fcntl
import hashlib
import json
import os
import shutil
import socket
from typing import Any, Iterable

import numpy as np

from dpsynrag_jax import digests
from dpsynrag_jax.faults import fault_point

CONFIG = "config.json"
SYNTHETIC_DB = "synthetic_db.jsonl"
INDEX = "index.faiss"
LEDGER = "privacy_ledger.json"
PARTITIONS = "partitions.json"
LEDGERS = "ledgers"
PRIVATE = "private"
NOISE_SEED = "noise_seed.json"   # under PRIVATE: the secret noise seed (privacy.keys)
DOCUMENT_DIGESTS = "document_digests.txt"   # private/: one sha256 per document, in order
LOCK = "build.lock"   # under PRIVATE: the build's exclusive lock and who holds it
RELEASED_FILES = (CONFIG, SYNTHETIC_DB, INDEX, LEDGER, PARTITIONS, LEDGERS)
EVALUATION = "evaluation"   # reports that read private state (dpsynrag_jax.evaluation_artifacts)


class WorkdirError(RuntimeError):
  """The work directory is in a state the requested run cannot continue from."""


class WorkdirLockedError(WorkdirError):
  """Another process is building (or appending) in the work directory."""




def atomic_write_text(path: str, text: str) -> None:
  tmp = f"{path}.tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    f.write(text)
    f.flush()
    os.fsync(f.fileno())
  fault_point(f"write:{os.path.basename(path)}")   # written, not yet in place
  os.replace(tmp, path)


def atomic_write_json(path: str, obj: Any) -> None:
  atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def read_json(path: str) -> Any:
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def atomic_save_npy(path: str, array: np.ndarray) -> None:
  tmp = f"{path}.tmp.npy"
  np.save(tmp, array)
  fault_point(f"save:{os.path.basename(path)}")
  os.replace(tmp, path)


def _drop_torn_line(path: str) -> None:
  """Cuts an unterminated last line (a kill mid-append) off `path`, so that the next append
  starts a line of its own instead of gluing a record onto half of one."""
  if not os.path.exists(path) or not os.path.getsize(path):
    return
  with open(path, "rb+") as f:
    f.seek(-1, os.SEEK_END)
    if f.read(1) == b"\n":
      return
    f.seek(0)
    f.truncate(f.read().rfind(b"\n") + 1)


def append_jsonl(path: str, records: Iterable[dict]) -> None:
  _drop_torn_line(path)
  with open(path, "a", encoding="utf-8") as f:
    for r in records:
      line = json.dumps(r, sort_keys=True) + "\n"
      # Half a line first: a kill at this point leaves the earlier records whole and this one
      # torn, as a real crash mid-write can (fault injection; read_jsonl drops it).
      f.write(line[:len(line) // 2])
      f.flush()
      fault_point(f"append:{os.path.basename(path)}")
      f.write(line[len(line) // 2:])
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


def make_private_dir(path: str) -> None:
  """Creates `path` (and its parents) with the private side owner-only: 0700 whatever the
  umask, and an existing one is narrowed to 0700 too."""
  os.makedirs(path, mode=0o700, exist_ok=True)
  os.chmod(path, 0o700)


class BuildLock:
  """An exclusive lock on a work dir for one build or append (a context manager).

  Entering creates what it needs (the dir, private/ owner-only, private/build.lock) and takes
  a non-blocking flock: a second build in the dir is refused at once with WorkdirLockedError
  naming the holder (host, pid, start time). The kernel drops the lock when its process ends,
  however it ends, so after a crash or SIGKILL the resume takes it at once.

  `prepared`: set it once the build has written into the dir. Leaving with an exception before
  that removes what entering created (a refused command leaves the dir as it found it).
  """

  def __init__(self, root: str):
    self.root = root
    self.path = os.path.join(root, PRIVATE, LOCK)
    self.prepared = False
    self._fd = None
    self._before = b""
    self._created: list[str] = []

  def __enter__(self) -> "BuildLock":
    private = os.path.join(self.root, PRIVATE)
    for d in (self.root, private):
      if not os.path.isdir(d):
        self._created.append(d)
    make_private_dir(private)
    if not os.path.exists(self.path):
      self._created.append(self.path)
    fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      holder = os.read(fd, 4096).decode("utf-8", "replace").strip()
      os.close(fd)
      self._remove_created()
      try:
        who = json.loads(holder)
        who = f"pid {who['pid']} on host {who['host']}, started {who['started']}"
      except (ValueError, KeyError, TypeError):
        who = "another process"
      raise WorkdirLockedError(
          f"{self.root} is in use by another build ({who}); wait for it to end, or stop it. "
          "Two builds in one work dir would release every text twice.") from None
    self._before = os.pread(fd, 4096, 0)   # put back if the command is refused
    os.ftruncate(fd, 0)
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    os.pwrite(fd, json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                              "started": started}).encode("utf-8"), 0)
    self._fd = fd
    return self

  def __exit__(self, exc_type, exc, tb) -> None:
    if exc_type is not None and not self.prepared:   # while still holding the lock
      if self.path not in self._created:
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, self._before, 0)
      self._remove_created()
    fcntl.flock(self._fd, fcntl.LOCK_UN)
    os.close(self._fd)
    self._fd = None

  def _remove_created(self) -> None:
    for path in reversed(self._created):
      try:
        if os.path.isdir(path):
          os.rmdir(path)   # only if still empty
        else:
          os.remove(path)
      except OSError:
        pass
    self._created = []


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
    self.check_prepare(config_dict, overwrite)
    config_path = self.path(CONFIG)
    resuming = os.path.exists(config_path) and not overwrite
    if os.path.exists(config_path) and overwrite:
      # Secret noise: clear() removes the old secret and the new build draws its own.
      self.clear()
    make_private_dir(self.private)
    atomic_write_json(config_path, config_dict)  # on a resume, runtime knobs may differ
    return resuming

  def check_prepare(self, config_dict: dict, overwrite: bool) -> None:
    """prepare()'s refusals (WorkdirError), without writing anything: a build checks them
    before its slow loading, and a refused command leaves the dir as it was."""
    config_path = self.path(CONFIG)
    if os.path.exists(config_path) and overwrite:
      old_seed = read_json(config_path).get("seed")
      if (config_dict["privacy"]["noise"] == "seeded" and
          old_seed == config_dict.get("seed")):
        raise WorkdirError(
            f"{self.root} holds a build with seed {old_seed}; overwriting it with the same seed "
            "would release new outputs with the same noise as the old ones. Pass a new "
            "--config.seed, or delete the work dir if nothing of the old build was released.")
      return
    if self.finished:
      raise WorkdirError(
          f"{self.root} holds a finished run; pass a new --workdir, or --config.runtime."
          "overwrite=True with a new --config.seed to build again.")
    if os.path.exists(config_path) and (comparable_config(read_json(config_path)) !=
                                        comparable_config(config_dict)):
      raise WorkdirError(
          f"{self.root} holds an interrupted run with a different config; resume it with the "
          "same config, or start over in a new work dir.")

  def clear(self) -> None:
    """Removes the released files (those of appended partitions too) and all private state but
    the lock (the build that clears the dir holds it)."""
    # evaluation/: reports of the old build (funnels), which would describe the wrong one.
    for name in RELEASED_FILES + (EVALUATION,):
      path = self.path(name)
      if os.path.isdir(path):
        shutil.rmtree(path)
      elif os.path.exists(path):
        os.remove(path)
    if os.path.isdir(self.private) and not os.path.exists(self.private_path(LOCK)):
      shutil.rmtree(self.private)
    elif os.path.isdir(self.private):
      for name in os.listdir(self.private):
        if name == LOCK:
          continue
        path = self.private_path(name)
        if os.path.isdir(path) and not os.path.islink(path):
          shutil.rmtree(path)
        else:
          os.remove(path)

  def holds_finished(self, config_dict: dict) -> bool:
    """A finished run of this config (runtime knobs aside) is here and can be reused."""
    return self.finished and (comparable_config(read_json(self.path(CONFIG))) ==
                              comparable_config(config_dict))

  def recorded_config(self) -> dict | None:
    """The config.json of the build in this dir, or None."""
    path = self.path(CONFIG)
    return read_json(path) if os.path.exists(path) else None

  def mark_finished(self) -> None:
    atomic_write_text(self.private_path("FINISHED"), "")

  # ---- private state of a build: what resumes it -----------------------------------------

  def verify_documents(self, documents) -> None:
    """Refuses to resume over other documents than the build recorded (writes nothing).

    Cached keywords, embeddings and cluster members are matched to documents by position: a
    corpus edited between an interruption and its resume would mix two datasets, and a person
    could land in 2L clusters.
    """
    path = self.private_path("documents.sha256")
    if not os.path.exists(path):
      return
    with open(path, encoding="utf-8") as f:
      recorded = f.read().strip()
    if recorded != digests.sequence_sha256(documents):
      raise WorkdirError(
          f"{self.root} holds a build of other documents than the ones loaded now (the corpus "
          "changed since it was started); resume with the same documents, or start a new "
          "work dir.")

  def check_documents(self, documents) -> None:
    """Records the private documents' digests; refuses to resume over other documents
    (verify_documents). The per-document digests let a later append (synrag.refresh) refuse
    documents already built. Both are private state (they identify the corpus)."""
    self.verify_documents(documents)
    path = self.private_path("documents.sha256")
    if not os.path.exists(path):
      atomic_write_text(path, digests.sequence_sha256(documents) + "\n")
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
    ("generation", "topic_terms"): "",
    ("generation", "lead_order"): "draw",
    ("privacy", "topic_share"): 0.5,   # read only with topic_terms
    # Read only with a 'discovered' topic term source.
    ("privacy", "rho_terms"): 0.05,
    ("privacy", "terms_delta_share"): 0.1,
    ("keywords", "vocabulary"): "public",
    ("discovery", "m"): 5,
    ("discovery", "max_n"): 3,
    ("discovery", "unit"): "runs",
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
