"""Incremental refresh: new documents become a new, disjoint partition with its own build.

    DIR/...                          the first build (partition 0), released files unchanged
    DIR/private/partitions/<k>/      partition k's whole build (a work dir of its own; private)
    DIR/ledgers/partition_<k>.json   released: partition k's privacy ledger
    DIR/partitions.json              released: every partition's spend and the per-document
                                     guarantee

Appending runs Algorithm 1 on the new documents only (its own histogram, clusters, re-ranking and
decode, with the first build's settings and a seed keyed by k) and appends its texts to
DIR/synthetic_db.jsonl and their vectors to DIR/index.faiss; texts already released are never
touched. Privacy: the partitions are disjoint sets of documents (each person's document is in
exactly one), so by parallel composition a document's loss is that of its own partition; the
old documents spend nothing more. `partitions.json` states the guarantee as the maximum over
partitions. A text once released cannot be unreleased: deleting a document later does not
delete what was built from it (see README, "Refreshing").

A person must not sit in two partitions silently: every build records a private sha256 per
document (workdir.DOCUMENT_DIGESTS), and an append holding any document already built in a
partition (partition 0 included) is refused, naming how many and where the first is. Charging
such documents twice (sequential composition) is the alternative; refusing keeps the stated
per-document guarantee true without asking the operator to reason about it.

Crash safety: the partition build resumes like any build; the merge checks the line count and
index size against partitions.json, so rerunning after a crash between its writes neither
duplicates nor loses texts.
"""

from __future__ import annotations

import json
import os

from absl import logging
import ml_collections
import numpy as np

from dpsynrag_jax import digests
from dpsynrag_jax import privacy
from dpsynrag_jax.data.private_documents import load_private_documents
from dpsynrag_jax.rag import index as rag_index
from dpsynrag_jax.synrag import pipeline
from dpsynrag_jax.synrag import workdir as wd_lib

PARTITIONS = wd_lib.PARTITIONS
LEDGERS = wd_lib.LEDGERS
_SEED_STRIDE = 1_000_003   # partition k's seed: base seed * stride + k (distinct, reproducible)


def _ledger_figures(path: str) -> dict:
  ledger = privacy.PrivacyLedger.load(path)
  return {"eps": ledger.spent_epsilon(), "accountant": ledger.accountant,
          "eps_closed_form": ledger.spent_epsilon("closed_form"),
          "eps_rdp": ledger.spent_epsilon("rdp"), "delta": ledger.delta}


def read_partitions(workdir: str) -> dict:
  """The released partitions.json, or the single-partition view of a build never appended to."""
  wd = wd_lib.Workdir(workdir)
  if os.path.exists(wd.path(PARTITIONS)):
    return wd_lib.read_json(wd.path(PARTITIONS))
  texts = len(wd_lib.read_jsonl(wd.path(wd_lib.SYNTHETIC_DB)))
  return _with_guarantee({"partitions": [
      {"index": 0, "ledger": wd_lib.LEDGER, "texts": texts,
       **_ledger_figures(wd.path(wd_lib.LEDGER))}]})


def _with_guarantee(doc: dict) -> dict:
  parts = doc["partitions"]
  doc["per_document"] = {
      "eps": max(p["eps"] for p in parts),   # each partition read by its own accountant
      "eps_closed_form": max(p["eps_closed_form"] for p in parts),
      "eps_rdp": max(p["eps_rdp"] for p in parts),
      "delta": max(p["delta"] for p in parts),
      "composition": "parallel over disjoint partitions: each document is in exactly one "
                     "partition, so its loss is its partition's"}
  return doc


def per_document_epsilon(workdir: str, accountant: str | None = None) -> float:
  """The epsilon every document of the database is protected at (max over partitions), by each
  ledger's own accountant (the one its build was calibrated with) unless `accountant` says."""
  key = {None: "eps", "closed_form": "eps_closed_form", "rdp": "eps_rdp"}[accountant]
  return read_partitions(workdir)["per_document"][key]


def partition_config(base: ml_collections.ConfigDict, documents_path: str,
                     k: int) -> ml_collections.ConfigDict:
  """The first build's settings on the new documents, with partition k's own seed."""
  config = base.copy_and_resolve_references()
  config.unlock()
  config.seed = int(base.seed) * _SEED_STRIDE + k
  config.data.name = "corpus"
  config.data.path = os.path.abspath(documents_path)
  config.data.num_documents = 0
  config.runtime.overwrite = False
  config.runtime.stop_after_clusters = -1
  return config


def append_documents(workdir: str, documents_path: str, *, lm=None, encoder=None,
                     stop_after_clusters: int = -1) -> dict:
  """Builds `documents_path` as the next partition of the finished build in `workdir` and
  appends its texts. Returns the updated partitions.json content.

  Raises WorkdirError when `workdir` holds no finished build or the file was appended before,
  and WorkdirLockedError while another build or append runs in `workdir`.
  """
  with wd_lib.BuildLock(workdir) as lock:
    return _append(workdir, documents_path, lock, lm=lm, encoder=encoder,
                   stop_after_clusters=stop_after_clusters)


def _append(workdir: str, documents_path: str, lock: wd_lib.BuildLock, *, lm, encoder,
            stop_after_clusters: int) -> dict:
  """append_documents under the work dir's lock."""
  wd = wd_lib.Workdir(workdir)
  if not wd.finished:
    raise wd_lib.WorkdirError(f"{workdir} holds no finished build to append to; build it first.")
  if not os.path.isfile(documents_path):
    raise FileNotFoundError(f"No documents file {documents_path!r}.")
  # Which file became which partition is private bookkeeping (a hash of private data).
  registry_path = wd.private_path("partitions.json")
  registry = wd_lib.read_json(registry_path) if os.path.exists(registry_path) else {}
  digest = digests.file_sha256(documents_path)
  released = read_partitions(workdir)
  merged = {p["index"] for p in released["partitions"]}
  if digest in registry and registry[digest] in merged:
    raise wd_lib.WorkdirError(
        f"{documents_path} was appended already (partition {registry[digest]}); its documents "
        "must not be built twice (that would be sequential, not parallel, composition).")
  k = registry.get(digest, max(merged | set(registry.values()), default=0) + 1)
  base = ml_collections.ConfigDict(wd_lib.read_json(wd.path(wd_lib.CONFIG)))
  config = partition_config(base, documents_path, k)
  config.runtime.stop_after_clusters = stop_after_clusters
  part_dir = wd.private_path(os.path.join("partitions", str(k)))
  part = wd_lib.Workdir(part_dir)
  if not part.finished:
    _refuse_built_documents(wd, base, config, merged, set(registry.values()) - {k})
  registry[digest] = k
  lock.prepared = True
  wd_lib.atomic_write_json(registry_path, registry)
  if not part.finished:
    logging.info("Building partition %d from %s.", k, documents_path)
    pipeline.build_synthetic_db(config, part_dir, lm=lm, encoder=encoder)
  return _merge(wd, part, k, released)


def _built_digests(wd: wd_lib.Workdir, base: ml_collections.ConfigDict, merged,
                   started) -> set[str]:
  """Per-document digests (private) of partition 0, of the merged partitions, and of the
  partitions whose build has started (`started`, registered but not merged yet)."""
  built = wd.document_digests()
  if built is None:  # a build from before the digests were recorded: read its documents
    built = digests.text_sha256s(load_private_documents(base.data)[0])
  out = set(built)
  for k in sorted((set(merged) | set(started)) - {0}):
    part_dir = wd.private_path(os.path.join("partitions", str(k)))
    part = wd_lib.Workdir(part_dir).document_digests()
    if part is None and k in merged:
      raise wd_lib.WorkdirError(f"Partition {k} of {wd.root} records no document digests; "
                                "cannot check the new documents against it.")
    out |= set(part or ())
  return out


def _refuse_built_documents(wd: wd_lib.Workdir, base, config, merged, started) -> None:
  """WorkdirError if a new document was built in an earlier partition already."""
  documents, where = load_private_documents(config.data)
  built = _built_digests(wd, base, merged, started)
  repeated = [place for place, digest in zip(where, digests.text_sha256s(documents))
              if digest in built]
  if repeated:
    raise wd_lib.WorkdirError(
        f"{len(repeated)} of the {len(documents)} new documents were built in an earlier "
        f"partition already (the first: {repeated[0]}). A person in two partitions would pay "
        "twice (sequential composition), which partitions.json would not show; remove them "
        "from the file and append again.")


def _merge(wd: wd_lib.Workdir, part: wd_lib.Workdir, k: int, released: dict) -> dict:
  """Appends partition k's texts and vectors to the release; idempotent after a crash."""
  new_records = [{**r, "partition": k} for r in wd_lib.read_jsonl(part.path(wd_lib.SYNTHETIC_DB))]
  before = sum(p["texts"] for p in released["partitions"])
  lines = wd_lib.read_jsonl(wd.path(wd_lib.SYNTHETIC_DB))
  if len(lines) == before:
    wd_lib.append_jsonl(wd.path(wd_lib.SYNTHETIC_DB), new_records)
  elif len(lines) != before + len(new_records):
    raise wd_lib.WorkdirError(f"{wd.path(wd_lib.SYNTHETIC_DB)} holds {len(lines)} texts, "
                              f"expected {before} or {before + len(new_records)}.")
  index = rag_index.load_index(wd.path(wd_lib.INDEX))
  if index.ntotal == before and new_records:
    part_index = rag_index.load_index(part.path(wd_lib.INDEX))
    index.add(part_index.reconstruct_n(0, part_index.ntotal).astype(np.float32))
    rag_index.save_index(index, wd.path(wd_lib.INDEX))  # atomic
  os.makedirs(wd.path(LEDGERS), exist_ok=True)
  ledger_name = os.path.join(LEDGERS, f"partition_{k}.json")
  with open(part.path(wd_lib.LEDGER), encoding="utf-8") as f:
    wd_lib.atomic_write_text(wd.path(ledger_name), f.read())
  released = json.loads(json.dumps(released))
  released["partitions"].append({"index": k, "ledger": ledger_name, "texts": len(new_records),
                                 **_ledger_figures(wd.path(ledger_name))})
  released = _with_guarantee(released)
  wd_lib.atomic_write_json(wd.path(PARTITIONS), released)
  logging.info("Partition %d: %d texts appended; per-document epsilon %.4f (closed form).", k,
               len(new_records), released["per_document"]["eps_closed_form"])
  return released
