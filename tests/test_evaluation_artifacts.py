"""Evaluation artifacts: reports that read private state go under evaluation/, labelled not DP,
and every tool that writes one refuses a folder holding released files."""

import json
import os
import subprocess
import sys

import pytest

from dpsynrag_jax import evaluation_artifacts as artifacts
from dpsynrag_jax.synrag import workdir as wd_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _released_build(root):
  """A folder holding a build's released files at its top (their content does not matter)."""
  os.makedirs(os.path.join(root, wd_lib.PRIVATE))
  wd_lib.atomic_write_json(os.path.join(root, wd_lib.CONFIG), {"seed": 0})
  wd_lib.append_jsonl(os.path.join(root, wd_lib.SYNTHETIC_DB), [{"text": "t", "keyword": "k"}])
  return str(root)


def test_a_report_goes_to_the_evaluation_folder_labelled_not_dp(tmp_path, capsys):
  build = _released_build(tmp_path / "build")
  path = artifacts.evaluation_path(build, "report.json")
  assert path == os.path.join(build, "evaluation", "report.json")
  assert artifacts.evaluation_path(os.path.dirname(path), "x.md") == os.path.join(
      build, "evaluation", "x.md")   # an evaluation/ folder is not nested again
  artifacts.write_json(path, {"clusters": 3}, "tool", "cluster members")
  artifacts.write_text(os.path.splitext(path)[0] + ".md", "| a |\n", "tool", "cluster members")
  report = json.load(open(path))
  assert list(report)[0] == artifacts.FIELD and report["clusters"] == 3
  assert report[artifacts.FIELD] == {"tool": "tool", "reads": "cluster members",
                                     "differentially_private": False,
                                     "notice": artifacts.NOTICE}
  md = open(os.path.join(build, "evaluation", "report.md")).read()
  assert md.startswith("> **Evaluation artifact** (tool): reads cluster members.")
  assert "NOT differentially private" in md and md.endswith("| a |\n")
  artifacts.announce("tool", "cluster members")
  out = capsys.readouterr().out
  assert f"evaluation artifact written: {path}" in out
  assert "[tool] Evaluation artifact" in out and "NOT differentially private" in out


def test_a_folder_of_released_files_is_refused(tmp_path):
  build = _released_build(tmp_path / "build")
  with pytest.raises(artifacts.EvaluationArtifactError, match="evaluation/funnel.json"):
    artifacts.write_json(os.path.join(build, "funnel.json"), {}, "funnel", "members")
  with pytest.raises(artifacts.EvaluationArtifactError, match="beside released files"):
    artifacts.write_text(os.path.join(build, "funnel.md"), "", "funnel", "members")
  # A build's released subfolder (an append's ledgers/) is part of the release too.
  os.makedirs(os.path.join(build, wd_lib.LEDGERS))
  with pytest.raises(artifacts.EvaluationArtifactError):
    artifacts.check_destination(os.path.join(build, wd_lib.LEDGERS, "x.json"))
  assert sorted(os.listdir(build)) == [wd_lib.CONFIG, wd_lib.LEDGERS, wd_lib.PRIVATE,
                                       wd_lib.SYNTHETIC_DB]
  # A folder without released files, e.g. a scratch or benchmark folder, is fine.
  assert artifacts.check_destination(str(tmp_path / "scratch" / "r.json"))


@pytest.mark.parametrize("tool,flags", [
    ("funnel", ["--config=experiments/configs/evaluate.py:tiny", "--workdir={b}/../unused",
                "--json_out={b}/funnel.json"]),
    ("bench_build", ["--json_out={b}/bench.json"]),
    ("decode_variants", ["--json_out={b}/variants.json"]),
])
def test_every_tool_refuses_to_write_its_report_beside_a_release(tool, flags, tmp_path):
  """funnel --build_dir, bench_build and decode_variants check --json_out before any work."""
  build = _released_build(tmp_path / "build")
  before = sorted(os.listdir(build))
  proc = subprocess.run(
      [sys.executable, "-m", f"experiments.{tool}", f"--build_dir={build}"] +
      [f.format(b=build) for f in flags],
      cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
      env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert proc.returncode == 2   # a user error: one line, no traceback
  assert "error: " in proc.stderr and "beside released files" in proc.stderr
  assert "Traceback" not in proc.stderr
  assert "NOT differentially private" in proc.stdout + proc.stderr   # the notice, first
  assert sorted(os.listdir(build)) == before
