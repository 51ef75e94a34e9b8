"""The apps' persistent compilation cache (--compilation_cache): a second build of the same
shapes loads every compiled program from it and releases the same bytes."""

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow   # two build processes

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RELEASED = ("synthetic_db.jsonl", "privacy_ledger.json", "index.faiss", "config.json")


def _build(workdir, cache) -> None:
  # Every compile is cached whatever its duration, so the entry count is deterministic.
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.build_synthetic_db",
       "--config=experiments/configs/medical_synth.py:tiny", f"--workdir={workdir}",
       f"--compilation_cache={cache}"], cwd=REPO, env=env, capture_output=True, text=True,
      timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]


def test_a_warm_cache_compiles_nothing_and_releases_the_same_bytes(tmp_path):
  cache = tmp_path / "xla"
  _build(tmp_path / "cold", cache)
  entries = set(os.listdir(cache))
  assert entries   # the cold build filled it
  _build(tmp_path / "warm", cache)
  assert set(os.listdir(cache)) == entries   # every program of the second build was a hit
  for name in RELEASED:
    assert ((tmp_path / "cold" / name).read_bytes() ==
            (tmp_path / "warm" / name).read_bytes()), name
