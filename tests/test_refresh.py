"""Incremental refresh: new documents become a disjoint partition; old texts are untouched."""

import json
import os
import subprocess
import sys

import pytest

from dpsynrag_jax import digests
from dpsynrag_jax.data import load_medical_synth
from dpsynrag_jax.rag import index as rag_index
from dpsynrag_jax.synrag import pipeline
from dpsynrag_jax.synrag import refresh
from dpsynrag_jax.synrag import workdir as wd_lib
from dpsynrag_jax.synrag.pipeline import PipelineInterrupted
from experiments.configs import medical_synth

pytestmark = pytest.mark.slow   # builds and appends end to end

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def base_and_new(tmp_path_factory):
  """A finished tiny build on the first 200 notes, and 120 other patients' notes as JSONL."""
  root = tmp_path_factory.mktemp("refresh")
  base = str(root / "base")
  pipeline.build_synthetic_db(medical_synth.get_config("tiny"), base)
  notes = load_medical_synth(num_documents=320, num_validation=0, num_test=0).documents[200:]
  new_docs = root / "new.jsonl"
  new_docs.write_text("".join(json.dumps({"text": t}) + "\n" for t in notes))
  return base, str(new_docs)


def _copy(src, dst):
  subprocess.run(["cp", "-r", src, dst], check=True)
  return dst


def test_append_adds_a_partition_and_leaves_old_texts_alone(base_and_new, tmp_path):
  base, new_docs = base_and_new
  workdir = _copy(base, str(tmp_path / "db"))
  old_db = open(os.path.join(workdir, wd_lib.SYNTHETIC_DB), "rb").read()
  old_ledger = open(os.path.join(workdir, wd_lib.LEDGER), "rb").read()
  released = refresh.append_documents(workdir, new_docs)
  db = open(os.path.join(workdir, wd_lib.SYNTHETIC_DB), "rb").read()
  assert db.startswith(old_db) and len(db) > len(old_db)
  assert open(os.path.join(workdir, wd_lib.LEDGER), "rb").read() == old_ledger
  parts = released["partitions"]
  assert [p["index"] for p in parts] == [0, 1]
  records = wd_lib.read_jsonl(os.path.join(workdir, wd_lib.SYNTHETIC_DB))
  assert len(records) == parts[0]["texts"] + parts[1]["texts"]
  assert all(r["partition"] == 1 for r in records[parts[0]["texts"]:])
  assert rag_index.load_index(os.path.join(workdir, wd_lib.INDEX)).ntotal == len(records)
  # Parallel composition: each partition spent eps = 10, so each document is at eps = 10.
  assert abs(parts[1]["eps_closed_form"] - 10.0) < 1e-6
  assert abs(released["per_document"]["eps_closed_form"] - 10.0) < 1e-6
  assert os.path.exists(os.path.join(workdir, "ledgers", "partition_1.json"))
  # The released files say nothing about the new partition's documents (no counts, no hash).
  text = open(os.path.join(workdir, refresh.PARTITIONS)).read()
  assert "documents" not in text and digests.file_sha256(new_docs) not in text
  # Appending the same file again would spend its documents' budget twice.
  with pytest.raises(wd_lib.WorkdirError, match="appended already"):
    refresh.append_documents(workdir, new_docs)


def test_an_interrupted_append_resumes_to_the_same_release(base_and_new, tmp_path):
  base, new_docs = base_and_new
  straight = _copy(base, str(tmp_path / "straight"))
  refresh.append_documents(straight, new_docs)
  resumed = _copy(base, str(tmp_path / "resumed"))
  with pytest.raises(PipelineInterrupted):
    refresh.append_documents(resumed, new_docs, stop_after_clusters=2)
  refresh.append_documents(resumed, new_docs)
  for name in (wd_lib.SYNTHETIC_DB, wd_lib.INDEX, refresh.PARTITIONS,
               "ledgers/partition_1.json"):
    assert (open(os.path.join(straight, name), "rb").read() ==
            open(os.path.join(resumed, name), "rb").read()), name


def test_append_needs_a_finished_build(tmp_path, base_and_new):
  _, new_docs = base_and_new
  with pytest.raises(wd_lib.WorkdirError, match="no finished build"):
    refresh.append_documents(str(tmp_path), new_docs)


def test_cli_append(base_and_new, tmp_path):
  base, new_docs = base_and_new
  workdir = _copy(base, str(tmp_path / "cli"))
  proc = subprocess.run([sys.executable, "-m", "experiments.build_synthetic_db",
                         f"--workdir={workdir}", f"--append={new_docs}"], cwd=REPO,
                        capture_output=True, text=True, timeout=900, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert json.loads(proc.stdout)["eps_closed_form"] == pytest.approx(10.0)
