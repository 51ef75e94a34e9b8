"""launch.grid and launch.sweep: grids, local runs that resume, SLURM scripts, tables."""

import csv
import importlib
import os
import signal
import subprocess
import sys
import time

import pytest

from launch import grid
from launch import sweep as sweep_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A two-point build sweep on the tiny Medical config: what the resume test kills and restarts.
TWO_POINT_CONFIG = '''
from experiments.configs import medical_synth
from launch import grid

APP = "experiments.build_synthetic_db"


def get_config(arg="tiny"):
  return medical_synth.get_config(arg)


def get_sweep(name):
  return grid.product({"clustering.L": [1, 2]})
'''


def test_product_and_zip():
  assert grid.product({"a": [1, 2], "b": ["x"]}) == [{"a": 1, "b": "x"}, {"a": 2, "b": "x"}]
  assert grid.zipped({"a": [1, 2], "b": [3, 4]}) == [{"a": 1, "b": 3}, {"a": 2, "b": 4}]
  combined = grid.product(grid.zipped({"R": [1, 2], "k": [3, 4]}), {"seed": [0, 1]})
  assert len(combined) == 4 and {"R": 2, "k": 4, "seed": 1} in combined
  with pytest.raises(ValueError, match="differ in length"):
    grid.zipped({"a": [1], "b": [1, 2]})
  with pytest.raises(ValueError, match="two parts"):
    grid.product({"a": [1]}, {"a": [2]})
  assert grid.point_name({"x.clustering.L": 3, "seed": 0}) == "L=3,seed=0"
  assert grid.point_name({}) == "default"
  # Names keep only what varies across the sweep.
  assert grid.point_names([{"m": "x", "L": 1}, {"m": "x", "L": 3}]) == ["L=1", "L=3"]
  assert grid.point_names([{"m": "x"}]) == ["m=x"]


def test_every_shipped_sweep_names_real_config_fields(tmp_path):
  every_config = (("experiments/configs/evaluate.py:tiny",
                   ("sensitivity_L", "sensitivity_k", "epsilon", "seeds", "models", "datasets")),
                  ("experiments/configs/medical_synth.py:tiny",
                   ("epsilon", "clusters", "seeds", "tokens", "models")),
                  ("experiments/configs/ablations.py:tiny", ("seeds", "models")),
                  ("experiments/configs/utility_options.py:tiny", ("seeds", "models")),
                  ("experiments/configs/queries_vs_accuracy.py:tiny", ("seeds", "models")))
  for path, names in every_config:
    for name in names:
      sweep = sweep_lib.Sweep(os.path.join(REPO, path), name, str(tmp_path))
      assert len(sweep.points) >= 3
      importlib.import_module(sweep.app).sweep_rows  # pylint: disable=expression-not-assigned
  sweep = sweep_lib.Sweep(os.path.join(REPO, "experiments/configs/evaluate.py:tiny"),
                          "sensitivity_L", str(tmp_path))
  assert [sweep.config_of(p).dp_synrag.clustering.L for p in sweep.points] == [1, 3, 5, 7, 10]


def test_bad_sweeps_are_refused_with_the_reason(tmp_path):
  bad_key = tmp_path / "bad_key.py"
  bad_key.write_text(TWO_POINT_CONFIG.replace('"clustering.L"', '"clustering.no_such"'))
  with pytest.raises(ValueError, match="no field 'no_such'"):
    sweep_lib.Sweep(str(bad_key), "any", str(tmp_path))
  no_app = tmp_path / "no_app.py"
  no_app.write_text(TWO_POINT_CONFIG.replace('APP = "experiments.build_synthetic_db"', ""))
  with pytest.raises(ValueError, match="has no APP"):
    sweep_lib.Sweep(str(no_app), "any", str(tmp_path))
  with pytest.raises(ValueError, match="Unknown sweep"):
    sweep_lib.Sweep(os.path.join(REPO, "experiments/configs/evaluate.py:tiny"), "nope",
                    str(tmp_path))


def test_slurm_script_is_valid_bash_with_one_task_per_point(tmp_path):
  sweep = sweep_lib.Sweep(os.path.join(REPO, "experiments/configs/evaluate.py:tiny"),
                          "sensitivity_L", str(tmp_path))
  path = sweep_lib.run_slurm(sweep, gpus=2, cpus=16, mem="80G", time_limit="02:00:00",
                             partition="gpu", parallel=3)
  text = open(path).read()
  assert "#SBATCH --array=0-4%3" in text and "#SBATCH --gres=gpu:2" in text
  assert "#SBATCH --partition=gpu" in text
  assert text.count("--config.dp_synrag.clustering.L=") == 5
  assert subprocess.run(["bash", "-n", path], check=False).returncode == 0


def _sweep_cmd(config_path, workdir):
  return [sys.executable, "-m", "launch.sweep", f"--config={config_path}", "--sweep=L",
          "--runner=local", f"--workdir={workdir}"]


@pytest.mark.slow
def test_local_sweep_runs_resumes_after_a_kill_and_tabulates_the_ledgers(tmp_path):
  config_path = tmp_path / "two_point.py"
  config_path.write_text(TWO_POINT_CONFIG)
  workdir = tmp_path / "sweeps"
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  first = workdir / "L" / "L=1" / sweep_lib.DONE
  # Start the sweep, and kill it (launcher and run) once the first point has finished.
  proc = subprocess.Popen(_sweep_cmd(config_path, workdir), cwd=REPO, env=env,
                          start_new_session=True, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
  second = workdir / "L" / "L=2" / "private"
  # Wait (a hang guard, not a timing assumption) until the first point has finished and the
  # second has started its build, then kill both mid-run.
  deadline = time.time() + 900
  while not (first.exists() and second.exists()) and proc.poll() is None:
    assert time.time() < deadline, "the sweep never reached its second point"
    time.sleep(0.2)
  assert first.exists(), "the first point never finished"
  os.killpg(proc.pid, signal.SIGKILL)
  proc.wait()
  assert not (workdir / "L" / "L=2" / sweep_lib.DONE).exists()
  first_mtime = first.stat().st_mtime
  # The rerun skips the finished point and completes the other.
  out = subprocess.run(_sweep_cmd(config_path, workdir), cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=900, check=False)
  assert out.returncode == 0, out.stderr[-3000:]
  assert first.stat().st_mtime == first_mtime
  assert "L=1: finished, skipped" in out.stderr
  rows = list(csv.DictReader(open(workdir / "L" / "results.csv")))
  assert [r["L"] for r in rows] == ["1", "2"]
  for r in rows:
    assert abs(float(r["ledger_eps_closed_form"]) - 10.0) < 1e-6
    assert int(r["synthetic_texts"]) > 0
  assert (workdir / "L" / "results.md").stat().st_size > 0
  assert (workdir / "L" / "sweep.png").stat().st_size > 0
