"""Where one cluster's decode time goes, by the line of our code that emitted each op.

    python -m experiments.profile_decode --docs=64 --T=16 --json_out=profile.json

Builds the cluster of bench_generation (the first --docs public Medical notes), compiles and
runs its decode once untraced, prefills it again and traces one call of the T private steps
alone (jax.profiler, perfetto format), then sums the time of every executed op of the decode
program by the source line that emitted it (dpsynrag_jax.profiling). Op times on a CPU are
summed over the threads that ran them: the report gives their total over wall time x cores
(how busy the cores were) beside the per-line table. The trace itself stays in --trace_dir.
"""

from __future__ import annotations

import json
import os
import tempfile
import time

from absl import flags
import jax

from dpsynrag_jax import benchmarks
from dpsynrag_jax import profiling
from dpsynrag_jax.models.presets import DTYPES, dtype_named
from experiments import cli


def define_flags() -> None:
  """The app's flags, defined when it runs (not on import: apps import side by side)."""
  flags.DEFINE_string("model", "smollm2-135m-instruct",
                      "Model preset or path, or random:SHAPE (benchmarks.RANDOM_SHAPES).")
  flags.DEFINE_integer("docs", 64, "Documents in the cluster.")
  flags.DEFINE_integer("T", 16, "Private tokens traced.")
  flags.DEFINE_float("c", 0.106, "Clipping bound.")
  flags.DEFINE_enum("dtype", "float32", sorted(DTYPES), "Weights and activations.")
  flags.DEFINE_integer("top", 25, "Source lines printed.")
  flags.DEFINE_string("trace_dir", "", "Where the trace goes (default: a new temp folder).")
  flags.DEFINE_string("json_out", "", "Where to write the JSON report.")


def run(model: str, docs: int, T: int, c: float = 0.106, dtype: str = "float32",
        trace_dir: str = "") -> dict:
  """The report: wall seconds of the traced decode, op time and busy cores, and op time per
  source line and per function (profiling.attribute). The trace goes to trace_dir (default:
  a new temp folder)."""
  from dpsynrag_jax.data import load_medical_synth  # pylint: disable=g-import-not-at-top
  lm = benchmarks.load_model(model, dtype_named(dtype))
  documents = load_medical_synth(num_documents=docs, num_validation=0, num_test=0).documents
  ours = benchmarks.Ours(lm, documents, T, c)
  program, args = ours.prefilled_decode()
  # Compiled once, ahead of time: the calls below run this very executable, so the trace's op
  # names are those of its text.
  compiled = program.lower(*args).compile()
  hlo_text = compiled.as_text()
  start = time.perf_counter()
  jax.block_until_ready(compiled(*args))                # runs once, untraced
  untraced_s = time.perf_counter() - start
  _, args = ours.prefilled_decode()
  jax.block_until_ready(args)
  trace_dir = trace_dir or tempfile.mkdtemp(prefix="profile_decode_")
  with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
    start = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    wall_s = time.perf_counter() - start
  events = profiling.op_events(trace_dir, profiling.module_name(hlo_text))
  if not events:
    raise RuntimeError(f"the trace in {trace_dir} holds no op of the decode program")
  lines = profiling.source_lines(hlo_text)
  by_line = profiling.attribute(events, lines)
  op_s = sum(r["ms"] for r in by_line) / 1e3
  cores = os.cpu_count() or 1
  return {
      "model": model, "docs": docs, "T": T, "dtype": dtype, "rows": ours.shape[0],
      "cache_slots": ours.cache_slots, "backend": jax.default_backend(),
      "untraced_s": untraced_s, "traced_wall_s": wall_s, "op_s": op_s, "cores": cores,
      "busy_cores": op_s / wall_s,
      "unmapped_share": sum(r["share"] for r in by_line if r["source"] == profiling.UNMAPPED),
      "by_function": profiling.attribute(events, lines, by="function"),
      "by_line": by_line,
  }


def main(argv):
  del argv
  fl = flags.FLAGS
  trace_dir = fl.trace_dir or tempfile.mkdtemp(prefix="profile_decode_")
  report = run(fl.model, fl.docs, fl.T, fl.c, fl.dtype, trace_dir)
  print(f"decode of {report['T']} steps, {report['rows']} rows, {report['cache_slots']} cache "
        f"slots: {report['traced_wall_s']:.3f} s traced; op time {report['op_s']:.3f} s = "
        f"{report['busy_cores']:.2f} of {report['cores']} cores busy on average\n")
  print(profiling.markdown(report["by_function"], fl.top, report["T"], "step") + "\n")
  print(profiling.markdown(report["by_line"], fl.top, report["T"], "step"))
  print(f"\nThe trace (perfetto): {trace_dir}")
  if fl.json_out:
    with open(fl.json_out, "w", encoding="utf-8") as f:
      json.dump(report, f, indent=1)
      f.write("\n")


if __name__ == "__main__":
  define_flags()
  cli.run(main)
