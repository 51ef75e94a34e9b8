"""What an evaluation reads: its models, its task, and the private record of the documents
read for each dataset (`check_eval_data`)."""

from __future__ import annotations

import dataclasses
import os

from dpsynrag_jax import digests
from dpsynrag_jax.data.tasks import Task, load_task
from dpsynrag_jax.models import dtype_named, load_encoder, load_lm
from dpsynrag_jax.synrag import workdir as wd_lib

SPLITS = ("test", "validation")


def load_models(config):
  """(lm, encoder) of an evaluation config."""
  return (load_lm(config.model.lm, dtype=dtype_named(config.model.dtype)),
          load_encoder(config.model.encoder))


def load_eval_task(config, dataset: str, split: str = "test") -> Task:
  """The evaluation's task: its first num_documents documents and num_test test questions
  (0: all). With split 'validation', the first num_test VALIDATION questions stand in for the
  test questions (task.test), so settings can be chosen without reading the test questions.

  A MovieLens config made for one layout (config.movielens_layout) refuses a folder of the
  other: its settings (documents, R, batches) are the constants of one public dataset.
  """
  path = config.paths.get(dataset, "")
  expected = config.get("movielens_layout", "")
  if dataset == "movielens" and expected and path:
    from dpsynrag_jax.data.movielens_files import detect_layout  # pylint: disable=g-import-not-at-top
    found = detect_layout(path)
    if found != expected:
      arg = {"ml-100k": "movielens_cpu", "ml-1m": "movielens_paper"}[found]
      raise ValueError(f"{path} holds MovieLens {found}, but this config's settings are for "
                       f"{expected}; use --config=experiments/configs/evaluate.py:{arg} (the "
                       f"settings for {found}).")
  if split not in SPLITS:
    raise ValueError(f"split must be one of {SPLITS}, got {split!r}.")
  # 0 documents or test questions means all of them.
  count = config.num_test or None
  if split == "test":
    return load_task(dataset, path=path, num_documents=config.num_documents or None,
                     num_validation=0, num_test=count, seed=0)
  task = load_task(dataset, path=path, num_documents=config.num_documents or None,
                   num_validation=None, num_test=0, seed=0)
  return dataclasses.replace(task, test=task.validation[:count], validation=())



def check_eval_data(workdir: str, config, dataset: str, task: Task) -> None:
  """Records on the work dir's private side what the evaluation read for `dataset` under its
  public settings (dataset, num_documents cap): the documents' count and digest and the local
  path. Rows and builds are keyed by public settings only, so a later run with the same
  settings over other documents (another copy of the dataset) is refused here instead of
  reusing rows and builds of the first. The record is an evaluation artifact and private (the
  corpus size): never published.

  Raises ValueError when the record names other documents.
  """
  folder = os.path.join(workdir, wd_lib.PRIVATE, "data")
  path = os.path.join(folder, f"{dataset}_num_documents{int(config.num_documents)}.json")
  record = {"dataset": dataset, "num_documents": int(config.num_documents),
            "documents": len(task.documents),
            "documents_sha256": digests.sequence_sha256(task.documents),
            "path": config.paths.get(dataset, "")}
  if os.path.exists(path):
    recorded = wd_lib.read_json(path)
    if recorded["documents_sha256"] != record["documents_sha256"]:
      raise ValueError(
          f"{workdir} holds rows and builds of other {dataset} documents under the same "
          f"settings (num_documents={record['num_documents']}; they were read from "
          f"{recorded['path'] or 'the vendored data'}): use a new work dir for these.")
    return
  os.makedirs(folder, mode=0o700, exist_ok=True)
  wd_lib.atomic_write_json(path, record)
