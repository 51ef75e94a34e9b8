"""Device memory and time at peak of the private decode's programs for a model shape, planned
without the device: the programs are compiled with abstract weights and inputs on the backend at
hand (nothing is allocated) and read through XLA's own memory and cost analysis
(dpsynrag_jax.memory_plan).

    python -m experiments.memory_plan --model=llama-3.1-8b --dtype=bfloat16 \
        --rows=16,32,64,128,256 --suffixes=96,384 --json_out=docs/results/memory_plan/plan.json

The cache holds P + S + T slots: --prefix P, the shared prompt prefix (chat template and
instruction); each of --suffixes S, a suffix bucket (a document and the template's tail, padded
to language_model's ladder); --T, the private tokens (the paper's Table 6: 70). Prints one
table per suffix bucket, and the most rows of each bucket that fit on each device.
"""

from __future__ import annotations

import json
import os
import time

from absl import app
from absl import flags

from experiments import cli

DTYPE_NAMES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp32": "float32",
               "float32": "float32"}
# Fractions of device memory a plan may fill: JAX's default preallocation, and what
# XLA_PYTHON_CLIENT_MEM_FRACTION=.9 gives.
MEMORY_FRACTIONS = (0.75, 0.9)


def define_flags() -> None:
  """The app's flags, defined when it runs (not on import: apps import side by side)."""
  flags.DEFINE_string("model", "llama-3.1-8b",
                      "A shape of benchmarks.RANDOM_SHAPES, or a path to an HF config.json.")
  flags.DEFINE_enum("dtype", "bfloat16", sorted(DTYPE_NAMES), "Weights and KV cache.")
  flags.DEFINE_list("rows", ["16", "32", "64", "128", "256"],
                    "Rows (documents, padded) of one device's batch.")
  flags.DEFINE_integer("prefix", 50, "P: shared prompt-prefix tokens.")
  flags.DEFINE_list("suffixes", ["96", "384"], "S: suffix buckets (one table each).")
  flags.DEFINE_integer("T", 70, "Private tokens per cluster.")
  flags.DEFINE_integer("clusters", 1, "Clusters packed in each batch (divides every --rows).")
  flags.DEFINE_enum("layout", "accelerator", ["accelerator", "cpu"],
                    "The decode step of an accelerator (cache stacked over layers) or of a CPU "
                    "(per-layer caches, unrolled decode).")
  flags.DEFINE_string("json_out", "", "Where to write the JSON report.")


def model_config(name: str):
  from dpsynrag_jax import benchmarks  # pylint: disable=g-import-not-at-top
  from dpsynrag_jax.models.config import from_hf_config  # pylint: disable=g-import-not-at-top
  if name in benchmarks.RANDOM_SHAPES:
    return benchmarks.RANDOM_SHAPES[name]()
  if os.path.isfile(name):
    with open(name, encoding="utf-8") as f:
      return from_hf_config(json.load(f))
  raise app.UsageError(f"--model: {name!r} is neither a shape of benchmarks.RANDOM_SHAPES "
                       f"({', '.join(sorted(benchmarks.RANDOM_SHAPES))}) nor a config.json.")


def run(model: str, dtype: str, rows, prefix: int, suffixes, T: int, clusters: int = 1,
        layout: str = "accelerator", log=print) -> dict:
  """Plans every (suffix, rows) shape; returns the report (JSON-ready)."""
  import jax  # pylint: disable=g-import-not-at-top
  from dpsynrag_jax import memory_plan  # pylint: disable=g-import-not-at-top
  from dpsynrag_jax.models.presets import dtype_named  # pylint: disable=g-import-not-at-top
  cfg = model_config(model)
  rows = sorted(int(r) for r in rows)
  if any(r % clusters for r in rows):
    raise ValueError(f"--clusters={clusters} must divide every --rows ({rows}).")
  plans, fits = [], []
  for suffix in sorted(int(s) for s in suffixes):
    shape_plans = []
    for r in rows:
      start = time.perf_counter()
      shape_plans.append(memory_plan.plan(cfg, dtype_named(DTYPE_NAMES[dtype]), r,
                                          prefix=prefix, suffix=suffix, T=T,
                                          clusters=clusters, layout=layout))
      log(f"planned S={suffix} rows={r} in {time.perf_counter() - start:.1f} s")
    plans += shape_plans
    if len(rows) > 1:
      for device in memory_plan.DEVICES:
        for fraction in MEMORY_FRACTIONS:
          # The group's peak, and the decode loop's alone (what the cache and the loop need
          # once the prefill is done).
          for program in (None, "decode_loop"):
            fits.append({"suffix": suffix, "capacity": prefix + suffix + T,
                         **memory_plan.rows_that_fit(shape_plans, device, fraction,
                                                     program=program)})
  return {
      "what": "XLA's memory_analysis() and cost_analysis() of the private decode's compiled "
              "programs (abstract weights and inputs, nothing allocated); not measured on a "
              "device",
      "model": model, "parameters": cfg.num_params(), "dtype": DTYPE_NAMES[dtype],
      "prefix": prefix, "T": T, "layout": layout,
      "backend": jax.default_backend(), "jax": jax.__version__,
      "date": time.strftime("%Y-%m-%d"),
      "devices": [vars(d) for d in memory_plan.DEVICES],
      "memory_fraction_of_plans": memory_plan.JAX_MEMORY_FRACTION,
      "plans": plans, "rows_that_fit": fits,
  }


def table(report: dict) -> str:
  """Markdown tables: one per suffix bucket, then the rows that fit."""
  gb = lambda b: f"{b / 1e9:.2f}"
  names = [d["name"] for d in report["devices"]]
  lines = []
  for suffix in sorted({p["shape"]["suffix"] for p in report["plans"]}):
    plans = [p for p in report["plans"] if p["shape"]["suffix"] == suffix]
    lines += [f"S = {suffix}, C = {plans[0]['shape']['capacity']} slots (GB = 1e9 bytes; ms "
              "at peak from the compiled flops and the least bytes; a group is one prefill "
              "and T steps)", "",
              "| rows | weights | cache | temps step / loop / prefill | peak | GFLOP per step | " +
              " | ".join(f"{n}: ms per step | ms per group" for n in names) + " |",
              "|---" * (6 + 2 * len(names)) + "|"]
    for p in plans:
      prog = p["programs"]
      temps = " / ".join(gb(prog[k]["memory"]["temporaries"])
                         for k in ("decode_step", "decode_loop", "prefill_chunk"))
      cells = [str(p["shape"]["rows"]), gb(p["analytic"]["weights"]), gb(p["analytic"]["cache"]),
               temps, gb(p["peak_bytes"]), f"{prog['decode_step']['cost']['flops'] / 1e9:.0f}"]
      for n in names:
        expected = p["devices"][n]["expected"]
        cells += [f"{expected['decode_step_ms']:.2f}", f"{expected['group_ms']:.0f}"]
      lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
  if report["rows_that_fit"]:
    lines += ["Rows that fit (a line through the group's peaks, or the decode loop's):", "",
              "| S | device | fraction | of | fixed GB | MB per row | rows |",
              "|---|---|---|---|---|---|---|"]
    for f in report["rows_that_fit"]:
      lines.append(f"| {f['suffix']} | {f['device']} | {f['fraction']} | {f['program']} | "
                   f"{gb(f['fixed_bytes'])} | {f['per_row_bytes'] / 1e6:.1f} | {f['rows']} |")
  return "\n".join(lines)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  f = flags.FLAGS
  report = run(f.model, f.dtype, f.rows, f.prefix, f.suffixes, f.T, f.clusters, f.layout)
  print(table(report))
  if f.json_out:
    os.makedirs(os.path.dirname(os.path.abspath(f.json_out)), exist_ok=True)
    with open(f.json_out, "w", encoding="utf-8") as out:
      out.write(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
  define_flags()
  cli.run(main)
