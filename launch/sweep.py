"""Runs a config's sweep: locally one run after another, or as a SLURM array; then tabulates.

    python -m launch.sweep --config=experiments/configs/evaluate.py:tiny --sweep=sensitivity_L \
        --runner=local --workdir=runs/sweeps

The config file provides get_config(arg), get_sweep(name) (a list of override dicts, see
launch/grid.py) and APP, the experiment module that runs one config into one work dir. Each run
is `python -m APP --config=FILE:ARG --config.KEY=VALUE ... --workdir=WORKDIR/NAME/POINT`, so a
run reproduces by hand from sweep.json.

runners:
  local      runs the points in order in subprocesses; a point whose run finished is skipped, an
             interrupted one is restarted and resumes (the apps themselves resume); then
             aggregates.
  slurm      writes WORKDIR/NAME/sweep.sbatch, one array task per point (GPU resources from the
             --slurm_* flags); submit it with sbatch, then run --runner=aggregate.
  aggregate  tabulates whatever runs have finished.
Tables: WORKDIR/NAME/results.csv, results.md and sweep.png; the epsilon columns come from each
run's privacy ledger.
"""

from __future__ import annotations

import csv
import importlib
import importlib.util
import json
import os
import shlex
import subprocess
import sys
import time
from typing import Any, Sequence

from absl import app
from absl import flags
from absl import logging
import ml_collections

from launch import grid


DONE = "SWEEP_DONE"


class Sweep:
  """A config file's sweep: its points, their run dirs and commands."""

  def __init__(self, config_spec: str, name: str, workdir: str, python: str = sys.executable):
    path, _, arg = config_spec.partition(":")
    if not os.path.isfile(path):
      raise ValueError(f"No config file {path!r}.")
    spec = importlib.util.spec_from_file_location("_sweep_config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for attr in ("get_config", "get_sweep", "APP"):
      if not hasattr(module, attr):
        raise ValueError(f"{path} has no {attr}; a sweepable config defines get_config(arg), "
                         "get_sweep(name) and APP.")
    self.path, self.arg, self.name, self.python = path, arg, name, python
    self.app = module.APP
    self.base = module.get_config(arg) if arg else module.get_config()
    self.points: list[dict[str, Any]] = module.get_sweep(name)
    if not self.points:
      raise ValueError(f"Sweep {name!r} has no points.")
    for point in self.points:
      self.config_of(point)  # every key must exist, with a value of its type
    names = grid.point_names(self.points)
    if len(set(names)) != len(names):
      raise ValueError(f"Sweep {name!r} repeats a point: {names}.")
    self._names = {repr(p): n for p, n in zip(self.points, names)}
    self.varying_keys = [k for k in dict.fromkeys(k for p in self.points for k in p)
                         if len({repr(p.get(k)) for p in self.points}) > 1]
    self.dir = os.path.join(workdir, name)

  def name_of(self, point: dict[str, Any]) -> str:
    return self._names[repr(point)]

  def config_of(self, point: dict[str, Any]) -> ml_collections.ConfigDict:
    """The base config with a point's overrides (what the run's command line produces)."""
    config = self.base.copy_and_resolve_references()
    for key, value in point.items():
      parent, _, leaf = key.rpartition(".")
      node = config
      for part in filter(None, parent.split(".")):
        if part not in node:
          raise ValueError(f"Sweep key {key!r}: the config has no field {part!r}.")
        node = node[part]
      if leaf not in node:
        raise ValueError(f"Sweep key {key!r}: the config has no field {leaf!r}.")
      node[leaf] = value  # ConfigDict refuses a value of another type
    return config

  def run_dir(self, point: dict[str, Any]) -> str:
    return os.path.join(self.dir, self.name_of(point))

  def command(self, point: dict[str, Any]) -> list[str]:
    spec = f"{self.path}:{self.arg}" if self.arg else self.path
    return ([self.python, "-m", self.app, f"--config={spec}"] +
            [f"--config.{k}={v}" for k, v in point.items()] +
            [f"--workdir={self.run_dir(point)}"])

  def finished(self, point: dict[str, Any]) -> bool:
    return os.path.exists(os.path.join(self.run_dir(point), DONE))

  def write_manifest(self) -> None:
    os.makedirs(self.dir, exist_ok=True)
    manifest = {"config": self.path, "arg": self.arg, "sweep": self.name, "app": self.app,
                "points": [{"overrides": p, "dir": self.run_dir(p),
                            "command": shlex.join(self.command(p))} for p in self.points]}
    with open(os.path.join(self.dir, "sweep.json"), "w", encoding="utf-8") as f:
      json.dump(manifest, f, indent=1)


def define_flags() -> None:
  """The app's flags, defined when it runs (not on import: apps import side by side)."""
  flags.DEFINE_string("config", None, "Config file, FILE or FILE:ARG.")
  flags.DEFINE_string("sweep", None, "Name of a sweep of the config's get_sweep.")
  flags.DEFINE_enum("runner", "local", ["local", "slurm", "aggregate"], "Where to run.")
  flags.DEFINE_string("workdir", None, "Sweeps go to WORKDIR/NAME/POINT.")
  flags.DEFINE_string("python", sys.executable, "Interpreter of the runs.")
  flags.DEFINE_integer("slurm_gpus", 1, "GPUs per array task.")
  flags.DEFINE_integer("slurm_cpus", 8, "CPUs per array task.")
  flags.DEFINE_string("slurm_mem", "64G", "Memory per array task.")
  flags.DEFINE_string("slurm_time", "04:00:00", "Time limit per array task.")
  flags.DEFINE_string("slurm_partition", "", "Partition (empty: default).")
  flags.DEFINE_integer("slurm_parallel", 0, "Array tasks at once (0: no cap).")


def run_local(sweep: Sweep) -> None:
  """Each unfinished point in order; a failing run stops the sweep (rerun to resume)."""
  sweep.write_manifest()
  total = len(sweep.points)
  for i, point in enumerate(sweep.points, 1):
    if sweep.finished(point):
      logging.info("[%d/%d] %s: finished, skipped.", i, total, sweep.name_of(point))
      continue
    logging.info("[%d/%d] %s: running %s", i, total, sweep.name_of(point),
                 shlex.join(sweep.command(point)))
    start = time.time()
    os.makedirs(sweep.run_dir(point), exist_ok=True)
    with open(os.path.join(sweep.run_dir(point), "run.log"), "a", encoding="utf-8") as log:
      proc = subprocess.run(sweep.command(point), stdout=log, stderr=subprocess.STDOUT,
                            check=False)
    if proc.returncode != 0:
      raise RuntimeError(f"Run {sweep.name_of(point)} failed (exit {proc.returncode}); see "
                         f"{sweep.run_dir(point)}/run.log. Rerun the sweep to resume it.")
    with open(os.path.join(sweep.run_dir(point), DONE), "w", encoding="utf-8") as f:
      json.dump({"overrides": point, "seconds": round(time.time() - start, 1)}, f)
    logging.info("[%d/%d] %s: done in %.0f s.", i, total, sweep.name_of(point),
                 time.time() - start)


def slurm_script(sweep: Sweep, *, gpus: int, cpus: int, mem: str, time_limit: str,
                 partition: str = "", parallel: int = 0) -> str:
  """An sbatch array script: task i runs point i and marks it finished on success."""
  n = len(sweep.points)
  array = f"0-{n - 1}" + (f"%{parallel}" if parallel > 0 else "")
  logs = os.path.abspath(os.path.join(sweep.dir, "slurm-%A_%a.out"))
  lines = ["#!/bin/bash", f"#SBATCH --job-name={sweep.name}", f"#SBATCH --array={array}",
           f"#SBATCH --cpus-per-task={cpus}", f"#SBATCH --mem={mem}",
           f"#SBATCH --time={time_limit}", f"#SBATCH --output={logs}"]
  if gpus > 0:
    lines.append(f"#SBATCH --gres=gpu:{gpus}")
  if partition:
    lines.append(f"#SBATCH --partition={partition}")
  lines += ["set -euo pipefail", f"cd {shlex.quote(os.getcwd())}", "", "COMMANDS=("]
  lines += [f"  {shlex.quote(shlex.join(sweep.command(p)))}" for p in sweep.points]
  lines += [")", "DIRS=("]
  lines += [f"  {shlex.quote(sweep.run_dir(p))}" for p in sweep.points]
  lines += [")", "",
            'i="$SLURM_ARRAY_TASK_ID"',
            f'if [[ -e "${{DIRS[$i]}}/{DONE}" ]]; then echo "finished already"; exit 0; fi',
            'mkdir -p "${DIRS[$i]}"',
            'eval "${COMMANDS[$i]}"',
            f'echo "{{\\"slurm_job\\": \\"$SLURM_JOB_ID\\"}}" > "${{DIRS[$i]}}/{DONE}"', ""]
  return "\n".join(lines)


def run_slurm(sweep: Sweep, **resources) -> str:
  sweep.write_manifest()
  path = os.path.join(sweep.dir, "sweep.sbatch")
  with open(path, "w", encoding="utf-8") as f:
    f.write(slurm_script(sweep, **resources))
  os.chmod(path, 0o755)
  return path


# ---- aggregation ----------------------------------------------------------------------------

def collect(sweep: Sweep) -> list[dict]:
  """One table row per result row of every finished run, with the point's overrides."""
  module = importlib.import_module(sweep.app)
  rows = []
  for point in sweep.points:
    if not sweep.finished(point):
      continue
    for result in module.sweep_rows(sweep.config_of(point), sweep.run_dir(point)):
      rows.append({"point": sweep.name_of(point),
                   **{k.rsplit(".", 1)[-1]: v for k, v in point.items()
                      if k in sweep.varying_keys}, **result})
  return rows


def _columns(rows: Sequence[dict]) -> list[str]:
  columns: list[str] = []
  for r in rows:
    columns += [k for k in r if k not in columns]
  return columns


def _cell(value) -> str:
  if isinstance(value, float):
    return f"{value:.4g}"
  return "" if value is None else str(value)


# The markdown table's columns after the swept axes (results.csv keeps every column).
SUMMARY_COLUMNS = ("dataset", "method", "accuracy", "context_recall", "leakage",
                   "synthetic_texts", "ledger_eps_closed_form", "ledger_eps_rdp", "epsilon",
                   "seconds_build", "seconds_answer", "seconds")


def write_tables(sweep: Sweep, rows: Sequence[dict]) -> None:
  columns = _columns(rows)
  with open(os.path.join(sweep.dir, "results.csv"), "w", encoding="utf-8", newline="") as f:
    writer = csv.DictWriter(f, columns)
    writer.writeheader()
    writer.writerows(rows)
  axes = [k.rsplit(".", 1)[-1] for k in sweep.varying_keys]
  shown = [c for c in axes if c in columns] + [
      c for c in SUMMARY_COLUMNS if c in columns and c not in axes and
      (c != "epsilon" or "ledger_eps_closed_form" not in columns)]
  lines = [f"### Sweep {sweep.name} ({sweep.path}:{sweep.arg}, {len({r['point'] for r in rows})}"
           f" of {len(sweep.points)} runs finished)", "",
           "| " + " | ".join(shown) + " |", "|" + "---|" * len(shown)]
  lines += ["| " + " | ".join(_cell(r.get(c)) for c in shown) + " |" for r in rows]
  with open(os.path.join(sweep.dir, "results.md"), "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")
  _plot(sweep, rows)


def _plot(sweep: Sweep, rows: Sequence[dict]) -> None:
  """Each metric against the first numeric axis that varies, one line per method."""
  axes = [k.rsplit(".", 1)[-1] for k in sweep.varying_keys]
  varying = [a for a in axes if len({str(r.get(a)) for r in rows}) > 1 and
             all(isinstance(r.get(a), (int, float)) for r in rows)]
  metrics = [m for m in ("accuracy", "context_recall", "synthetic_texts")
             if any(isinstance(r.get(m), (int, float)) for r in rows)]
  if not rows or not varying or not metrics:
    return
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  x = varying[0]
  fig, plots = plt.subplots(1, len(metrics), figsize=(3.6 * len(metrics), 3.2), squeeze=False)
  for ax, metric in zip(plots[0], metrics):
    for method in sorted({str(r.get("method", "")) for r in rows}):
      pts = sorted((r[x], r[metric]) for r in rows if str(r.get("method", "")) == method and
                   isinstance(r.get(metric), (int, float)))
      if pts:
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=method or None)
    ax.set_xlabel(x)
    ax.set_title(metric.replace("_", " "))
  if any(r.get("method") for r in rows):
    plots[0][0].legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(os.path.join(sweep.dir, "sweep.png"), dpi=120)
  plt.close(fig)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  sweep = Sweep(flags.FLAGS.config, flags.FLAGS.sweep, flags.FLAGS.workdir, flags.FLAGS.python)
  if flags.FLAGS.runner == "slurm":
    path = run_slurm(sweep, gpus=flags.FLAGS.slurm_gpus, cpus=flags.FLAGS.slurm_cpus,
                     mem=flags.FLAGS.slurm_mem, time_limit=flags.FLAGS.slurm_time,
                     partition=flags.FLAGS.slurm_partition, parallel=flags.FLAGS.slurm_parallel)
    print(f"Wrote {path} ({len(sweep.points)} array tasks). Submit with: sbatch {path}")
    return
  if flags.FLAGS.runner == "local":
    run_local(sweep)
  rows = collect(sweep)
  write_tables(sweep, rows)
  print(f"{len(rows)} result rows from {sum(sweep.finished(p) for p in sweep.points)} of "
        f"{len(sweep.points)} runs -> {sweep.dir}/results.md")


if __name__ == "__main__":
  define_flags()
  flags.mark_flags_as_required(["config", "sweep", "workdir"])
  app.run(main)
