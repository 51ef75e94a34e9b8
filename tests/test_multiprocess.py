"""Two processes on one machine build the same database as one process (the multi-host path),
with secret noise: the process that prepares the build draws the secret, the others read it."""

import os
import socket
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow   # spawns build processes

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = "experiments/configs/medical_synth.py:tiny"
RELEASED = ("synthetic_db.jsonl", "privacy_ledger.json", "index.faiss", "config.json")


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _build(workdir, log_path, env_extra=None) -> subprocess.Popen:
  """A build process writing its output to log_path (a file, not a pipe: two workers that
  wait on each other must never block on a full pipe nobody reads)."""
  env = {**os.environ, "JAX_PLATFORMS": "cpu", **(env_extra or {})}
  log = open(log_path, "w", encoding="utf-8")
  proc = subprocess.Popen(
      [sys.executable, "-m", "experiments.build_synthetic_db", f"--config={CONFIG}",
       f"--workdir={workdir}", "--config.privacy.noise=secret"], cwd=REPO, env=env, stdout=log,
      stderr=subprocess.STDOUT)
  proc.log_path = log_path
  return proc


def _wait(proc: subprocess.Popen) -> str:
  proc.wait(timeout=900)
  out = open(proc.log_path, encoding="utf-8").read()
  assert proc.returncode == 0, out[-3000:]
  return out


def test_two_processes_release_what_one_process_releases(tmp_path):
  single, multi = tmp_path / "single", tmp_path / "multi"
  port = _free_port()
  workers = [_build(multi, tmp_path / f"worker{i}.log",
                    {"DPSYNRAG_COORDINATOR": f"localhost:{port}",
                     "DPSYNRAG_NUM_PROCESSES": "2", "DPSYNRAG_PROCESS_ID": str(i)})
             for i in range(2)]
  logs = [_wait(w) for w in workers]   # both run at once; each writes to its own file
  # Secret noise: process 0 drew the secret, process 1 read it. The single process gets the
  # same secret, so the two releases must agree byte for byte.
  os.makedirs(single / "private")
  (single / "private" / "noise_seed.json").write_bytes(
      (multi / "private" / "noise_seed.json").read_bytes())
  _wait(_build(single, tmp_path / "single.log"))
  assert "Process 1 of 2" in logs[1]
  for name in RELEASED:
    assert (multi / name).read_bytes() == (single / name).read_bytes(), name
  # Both processes decoded: process 1 kept its clusters in its own state file.
  private = multi / "private"
  assert (private / "generated.p1.jsonl").stat().st_size > 0
  assert (private / "generated.jsonl").stat().st_size > 0


def test_several_processes_refuse_overwrite(tmp_path, monkeypatch):
  from dpsynrag_jax import distributed  # pylint: disable=g-import-not-at-top
  from dpsynrag_jax.synrag import pipeline  # pylint: disable=g-import-not-at-top
  from experiments.configs import medical_synth  # pylint: disable=g-import-not-at-top
  config = medical_synth.get_config("tiny")
  config.runtime.overwrite = True
  monkeypatch.setattr(distributed, "maybe_initialize", lambda: None)
  monkeypatch.setattr(distributed, "process_count", lambda: 2)
  import pytest  # pylint: disable=g-import-not-at-top
  with pytest.raises(ValueError, match="overwrite is refused"):
    pipeline.build_synthetic_db(config, str(tmp_path))


def test_launched_processes_reads_slurm_and_explicit_settings(monkeypatch):
  from dpsynrag_jax import distributed  # pylint: disable=g-import-not-at-top
  monkeypatch.delenv(distributed.ENV_NUM_PROCESSES, raising=False)
  monkeypatch.delenv("SLURM_NTASKS", raising=False)
  assert distributed.launched_processes() == 1
  monkeypatch.setenv("SLURM_NTASKS", "4")
  assert distributed.launched_processes() == 4
  monkeypatch.setenv(distributed.ENV_NUM_PROCESSES, "2")
  assert distributed.launched_processes() == 2
  monkeypatch.setenv(distributed.ENV_NUM_PROCESSES, "two")
  import pytest  # pylint: disable=g-import-not-at-top
  with pytest.raises(ValueError, match="must be an integer"):
    distributed.launched_processes()
