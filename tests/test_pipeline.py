"""DP-SynRAG end to end on a tiny random model and 200 Medical Synth documents."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from dpsynrag_jax import privacy
from dpsynrag_jax.rag import index as rag_index
from dpsynrag_jax.synrag import pipeline
from dpsynrag_jax.synrag import workdir as wd_lib
from experiments.configs import medical_synth

pytestmark = pytest.mark.slow   # builds end to end

RELEASED = ("config.json", "synthetic_db.jsonl", "index.faiss", "privacy_ledger.json")


def tiny_config(**overrides):
  config = medical_synth.get_config("tiny")
  for dotted, value in overrides.items():
    section, field = dotted.split(".")
    config[section][field] = value
  return config


def _released_bytes(workdir):
  return {name: open(os.path.join(workdir, name), "rb").read() for name in RELEASED}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("tiny_run"))
  summary = pipeline.build_synthetic_db(tiny_config(), workdir)
  return workdir, summary


def test_run_writes_the_released_files(finished_run):
  workdir, summary = finished_run
  assert sorted(os.listdir(workdir)) == sorted(RELEASED + ("private",))
  records = wd_lib.read_jsonl(os.path.join(workdir, "synthetic_db.jsonl"))
  assert len(records) == summary["synthetic_texts"] > 0
  assert all(set(r) == {"text", "keyword"} and r["text"] for r in records)
  index = rag_index.load_index(os.path.join(workdir, "index.faiss"))
  assert index.ntotal == len(records)


def test_ledger_total_equals_theorem1_for_the_config(finished_run):
  workdir, summary = finished_run
  config = tiny_config()
  cal = pipeline.calibration_of(config)
  ledger = privacy.PrivacyLedger.load(os.path.join(workdir, "privacy_ledger.json"))
  expected_rho = privacy.theorem1_rho(cal.K, cal.sigma_h, cal.L, cal.eps_theta, cal.sigma_mu,
                                      cal.T, cal.c, cal.tau)
  assert ledger.rho == pytest.approx(expected_rho, rel=1e-9)
  assert ledger.spent_epsilon("closed_form") == pytest.approx(config.privacy.epsilon, rel=1e-9)
  assert summary["eps_closed_form"] == pytest.approx(config.privacy.epsilon, rel=1e-9)
  # One histogram, and per cluster a mean, a threshold and T tokens, for all R clusters.
  kinds = [e.kind for e in ledger.entries]
  R = config.clustering.R
  assert kinds.count("gaussian") == 1 + R and kinds.count("exponential") == R
  assert kinds.count("tokens") == R


def test_released_files_hold_no_counts_ids_or_sizes(finished_run):
  workdir, _ = finished_run
  private_state = [wd_lib.read_jsonl(os.path.join(workdir, "private", "selected.jsonl"))]
  members = [len(r["members"]) for r in private_state[0]]
  ledger = json.load(open(os.path.join(workdir, "privacy_ledger.json")))
  allowed = {"sensitivity", "sigma", "epsilon", "count", "c", "tau"}
  for entry in ledger["entries"]:
    assert set(entry["params"]) <= allowed, entry
    if entry["kind"] == "tokens":
      assert entry["params"]["count"] == tiny_config().generation.T  # T, not tokens produced
  for record in wd_lib.read_jsonl(os.path.join(workdir, "synthetic_db.jsonl")):
    assert set(record) == {"text", "keyword"}
  config = json.load(open(os.path.join(workdir, "config.json")))
  text = json.dumps(config)
  assert "members" not in text and "cluster_size" not in text
  assert len(members) == tiny_config().clustering.R  # the private state does hold them


def test_a_finished_run_is_not_overwritten_unless_asked(finished_run):
  workdir, _ = finished_run
  with pytest.raises(wd_lib.WorkdirError, match="finished run"):
    pipeline.build_synthetic_db(tiny_config(), workdir)


def test_interrupted_run_resumes_byte_identical(finished_run, tmp_path):
  reference, _ = finished_run
  workdir = str(tmp_path / "resumed")
  with pytest.raises(pipeline.PipelineInterrupted):
    pipeline.build_synthetic_db(tiny_config(**{"runtime.stop_after_clusters": 2}), workdir)
  ledger = privacy.PrivacyLedger.load(os.path.join(workdir, "private", "ledger.json"))
  # Every cluster's tokens are charged before the first is decoded; the decode stopped part way.
  assert sum(e.kind == "tokens" for e in ledger.entries) == tiny_config().clustering.R
  decoded = wd_lib.read_jsonl(os.path.join(workdir, "private", "generated.jsonl"))
  assert 2 <= len(decoded) < tiny_config().clustering.R
  with pytest.raises(wd_lib.WorkdirError, match="different config"):
    pipeline.build_synthetic_db(tiny_config(**{"privacy.epsilon": 3.0}), workdir)
  pipeline.build_synthetic_db(tiny_config(), workdir)
  assert _released_bytes(workdir) == _released_bytes(reference)


def test_user_corpus_in_jsonl(tmp_path):
  from dpsynrag_jax.data import load_medical_synth
  docs = load_medical_synth(num_documents=120, num_validation=0, num_test=0).documents
  path = tmp_path / "docs.jsonl"
  path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs) + "\n")
  summary = pipeline.build_synthetic_db(
      tiny_config(**{"data.name": "corpus", "data.path": str(path), "data.num_documents": 0,
                     "clustering.R": 3}), str(tmp_path / "run"))
  assert summary["clusters"] == 3


def test_too_long_documents_error_names_the_line(tmp_path):
  path = tmp_path / "docs.jsonl"
  path.write_text(json.dumps({"text": "short note"}) + "\n" +
                  json.dumps({"text": "word " * 400}) + "\n")
  with pytest.raises(ValueError, match=r"docs.jsonl line 2 has \d+ tokens"):
    pipeline.build_synthetic_db(
        tiny_config(**{"data.name": "corpus", "data.path": str(path),
                       "data.too_long": "error"}), str(tmp_path / "run"))


@pytest.mark.slow
def test_output_does_not_depend_on_the_number_of_devices(tmp_path):
  """1 device vs 4 (forced host devices): the released files are byte-identical."""
  script = textwrap.dedent(f"""
      import os
      os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
      os.environ["JAX_PLATFORMS"] = "cpu"
      import jax
      assert jax.local_device_count() == 4
      from dpsynrag_jax.synrag import pipeline
      from experiments.configs import medical_synth
      for devices in (1, 4):
        config = medical_synth.get_config("tiny")
        config.clustering.R = 8
        config.runtime.devices = devices
        pipeline.build_synthetic_db(config, os.path.join({str(tmp_path)!r}, f"d{{devices}}"))
      """)
  subprocess.run([sys.executable, "-c", script], check=True, cwd=os.getcwd())
  one, four = _released_bytes(tmp_path / "d1"), _released_bytes(tmp_path / "d4")
  config_free = lambda files: {k: v for k, v in files.items() if k != "config.json"}
  assert config_free(one) == config_free(four)
