"""Benchmark of one cluster's private decode: ours (jitted JAX) against a PyTorch reference.

    python -m experiments.bench_generation --model=smollm2-135m-instruct --docs=64 --T=70 \
        --json_out=bench.json

In one process, alternating ours / reference for --pairs pairs (A B A B ...):
  - ours: private_decode's cluster program (shared prefix, suffix prefill, T steps of
    clip -> masked sum -> sample -> feed back, one jitted while_loop);
  - reference: the same weights loaded by transformers (PyTorch, eager), the same prompts,
    prefill with a KV cache, then a Python loop per token that clips, sums, samples and feeds
    the token to every row: how a transformers user would write it;
  - a 2048 x 2048 fp32 matmul in NumPy, JAX and PyTorch: the machine's measured peak (best of
    the three);
  - a streaming read and an in-place update of an array larger than the last-level cache: the
    machine's measured memory bandwidth;
  - after the pairs, one decode step's weight matmuls alone at the cluster's rows (and at
    --ceiling_rows), and from them the floor of a decode step: those matmuls, then the bytes
    the step moves besides the weights (KV-cache read and write, logits) at the measured
    bandwidth. T floors against the decode part's time (the prefill is timed apart) say how far
    each decoder is from this machine's limit, as a ratio.
Both decoders run exactly T steps (EOS ignored) on identical prompts. FLOPs are the nominal
work of the cluster (every row's full prompt + T tokens: weight matmuls, LM head, attention),
the same for both, so GFLOP/s compare like for like.
"""

from __future__ import annotations

import json
import resource
import statistics
import sys
import time

from absl import app
from absl import flags
import jax
import numpy as np

from dpsynrag_jax import benchmarks
from dpsynrag_jax.models.presets import DTYPES, dtype_named
from experiments import cli


def define_flags() -> None:
  """The app's flags, defined when it runs (not on import: apps import side by side)."""
  flags.DEFINE_string(
      "model", "smollm2-135m-instruct",
      "Model preset or path, or random:SHAPE for a randomly initialised model of a shape in "
      "benchmarks.RANDOM_SHAPES (no download; ours only).")
  flags.DEFINE_integer("docs", 64, "Documents in the cluster.")
  flags.DEFINE_integer("T", 70, "Private tokens.")
  flags.DEFINE_integer("pairs", 5, "Timed ours/reference pairs.")
  flags.DEFINE_float("c", 0.106, "Clipping bound (c/tau of the paper's calibration).")
  flags.DEFINE_string("json_out", "", "Where to write the JSON report.")
  flags.DEFINE_bool("reference", True, "Run the PyTorch reference.")
  flags.DEFINE_enum("dtype", "float32", sorted(DTYPES),
                    "Our weights and activations (the reference stays float32).")
  flags.DEFINE_list("ceiling_rows", ["16", "64", "128"],
                    "After the pairs, time one decode step's weight matmuls alone at these row "
                    "counts (the most a decode step can reach here); empty skips it. The "
                    "floor times them at the cluster's own row count in any case.")
  flags.DEFINE_integer("bandwidth_mb", 0,
                       "Array of the memory-bandwidth kernels, MiB (0: 4 x the last-level "
                       "cache on a CPU, 1 GiB on an accelerator).")


def _stats(times, flops, peak):
  med = statistics.median(times)
  return {"median_s": med, "all_s": [round(t, 3) for t in times], "gflops": flops / med / 1e9,
          "fraction_of_peak": flops / med / 1e9 / peak}


def _floor(lm, ours, T, matmul_step_s, bandwidth, report) -> dict:
  """The floor of the cluster's decode (T steps; the prefill is not in it) and each decoder's
  decode time over it."""
  rows = ours.shape[0]
  step_bytes = benchmarks.decode_step_bytes(lm.config, rows, ours.cache_slots, lm.dtype)
  step = benchmarks.decode_floor(matmul_step_s, step_bytes["total"], bandwidth["peak"])
  out = {"prefill_included": False, "rows": rows, "cache_slots": ours.cache_slots,
         "bandwidth_gbs": bandwidth["peak"], "bytes_per_step": step_bytes, **step,
         "decode_s": T * step["step_s"]}
  out["ours_decode_s"] = report["ours"]["decode_median_s"]
  out["ours_decode_over_floor"] = out["ours_decode_s"] / out["decode_s"]
  # The measured prefill plus the decode's floor: a whole cluster's time with a floor decode.
  out["with_measured_prefill_s"] = out["decode_s"] + report["ours"]["prefill_median_s"]
  out["ours_per_cluster_over_it"] = report["ours"]["per_cluster_s"] / out[
      "with_measured_prefill_s"]
  # The reference decodes `docs` rows, unpadded: the same rows when docs is a multiple of the
  # row bucket, fewer (and a lower floor of its own) otherwise.
  if "reference" in report:
    out["reference_decode_s"] = report["reference"]["decode_median_s"]
    out["reference_decode_over_floor"] = out["reference_decode_s"] / out["decode_s"]
  return out


def floor_line(report) -> str:
  """One line of the floor's figures."""
  f = report["floor"]
  line = (f"floor of a decode step ({f['rows']} rows, {f['cache_slots']} cache slots): "
          f"weight matmuls {1e3 * f['weight_matmul_step_s']:.1f} ms + "
          f"{f['bytes_per_step']['total'] / 1e6:.1f} MB at {f['bandwidth_gbs']:.1f} GB/s "
          f"{1e3 * f['memory_step_s']:.1f} ms = {1e3 * f['step_s']:.1f} ms; decode of "
          f"{report['T']} steps (prefill apart): floor {f['decode_s']:.3f} s, ours "
          f"{f['ours_decode_s']:.3f} s = {f['ours_decode_over_floor']:.2f} x floor")
  if "reference_decode_over_floor" in f:
    line += (f", reference {f['reference_decode_s']:.3f} s = "
             f"{f['reference_decode_over_floor']:.2f} x floor")
  return line


def run(model: str, docs: int, T: int, pairs: int, c: float, reference: bool,
        dtype: str = "float32", ceiling_rows=(), bandwidth_bytes: int | None = None) -> dict:
  from dpsynrag_jax.data import load_medical_synth  # pylint: disable=g-import-not-at-top
  from dpsynrag_jax.models import presets  # pylint: disable=g-import-not-at-top
  if reference and model.startswith("random:"):
    raise app.UsageError("The PyTorch reference needs a checkpoint: pass --noreference with "
                         "random:SHAPE.")
  load_start = time.perf_counter()
  lm = benchmarks.load_model(model, dtype_named(dtype))
  load_seconds = time.perf_counter() - load_start
  documents = load_medical_synth(num_documents=docs, num_validation=0, num_test=0).documents
  ours = benchmarks.Ours(lm, documents, T, c)
  prompts = lm.encode([lm.chat_prompt(ours.predictor.prompt.format(d=d)) for d in documents])
  flops = benchmarks.nominal_flops(lm.config, [len(p) for p in prompts], T)
  on_accelerator = jax.default_backend() != "cpu"
  peak = benchmarks.matmul_peak(n=8192 if on_accelerator else 2048, dtype=dtype)
  bandwidth = benchmarks.memory_bandwidth(bandwidth_bytes)

  start = time.perf_counter()
  ours.run()
  compile_and_first = time.perf_counter() - start
  ours.prefill()
  rss_after_ours = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

  ref = None
  if reference:
    path = presets.resolve_lm(model)
    if not path.endswith(".gguf"):
      raise app.UsageError("The reference loads GGUF presets/files only.")
    ref = benchmarks.Reference(path, prompts, T, c, lm.pad_id)
    ref.run()  # warm-up (allocator, threads)
  ours_total, ours_prefill, ref_total, ref_prefill = [], [], [], []
  for _ in range(pairs):
    ours_total.append(ours.run())
    ours_prefill.append(ours.prefill())
    if ref is not None:
      p, t = ref.run()
      ref_prefill.append(p)
      ref_total.append(t)
  ours_stats = _stats(ours_total, flops, peak["peak"])
  report = {
      "model": model, "docs": docs, "T": T, "pairs": pairs, "dtype": dtype,
      "parameters": lm.config.num_params(), "load_s": load_seconds,
      "prompt_tokens_mean": float(np.mean([len(p) for p in prompts])),
      "shared_prefix_tokens": len(ours.predictor.prefix),
      "padded_shape_rows_suffix": list(ours.shape),
      "nominal_gflop": flops / 1e9,
      "matmul_peak_gflops": peak,
      "memory_bandwidth_gbs": bandwidth,
      "ours": {**ours_stats, "prefill_median_s": statistics.median(ours_prefill),
               "decode_median_s": ours_stats["median_s"] - statistics.median(ours_prefill),
               "compile_plus_first_run_s": compile_and_first,
               "per_cluster_s": ours_stats["median_s"],
               "tokens_per_s": docs * T / ours_stats["median_s"],
               "peak_rss_mb_after": rss_after_ours},
      "devices": [str(d) for d in jax.devices()],
  }
  if ref is not None:
    ref_stats = _stats(ref_total, flops, peak["peak"])
    report["reference"] = {**ref_stats, "prefill_median_s": statistics.median(ref_prefill),
                           "decode_median_s": ref_stats["median_s"] -
                           statistics.median(ref_prefill),
                           "tokens_per_s": docs * T / ref_stats["median_s"],
                           "peak_rss_mb_after":
                               resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    report["ratio_ours_over_reference"] = ours_stats["median_s"] / ref_stats["median_s"]
    report["pairwise_ratios"] = [round(a / b, 3) for a, b in zip(ours_total, ref_total)]
  ceiling = benchmarks.weight_matmul_ceiling(
      lm.config, sorted(set(ceiling_rows) | {ours.shape[0]}), dtype)
  if ceiling_rows:
    report["weight_matmul_ceiling"] = [
        {**row, "fraction_of_peak": row["gflops"] / peak["peak"],
         "torch_fraction_of_peak": row.get("torch_gflops", 0.0) / peak["peak"]}
        for row in ceiling if row["rows"] in ceiling_rows]
  matmul_step_s = next(row["step_s"] for row in ceiling if row["rows"] == ours.shape[0])
  report["floor"] = _floor(lm, ours, T, matmul_step_s, bandwidth, report)
  return report


def main(argv):
  del argv
  fl = flags.FLAGS
  report = run(fl.model, fl.docs, fl.T, fl.pairs, fl.c, fl.reference, fl.dtype,
               [int(n) for n in fl.ceiling_rows], fl.bandwidth_mb * 2**20 or None)
  text = json.dumps(report, indent=1)
  print(text)
  print(floor_line(report), file=sys.stderr)   # stdout stays one JSON document
  if flags.FLAGS.json_out:
    with open(flags.FLAGS.json_out, "w", encoding="utf-8") as f:
      f.write(text + "\n")


if __name__ == "__main__":
  define_flags()
  cli.run(main)
