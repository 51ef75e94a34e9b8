"""Whole-build benchmark: the private decode of a real build's clusters, and whole builds.

    python -m experiments.bench_build --build_dir=runs/paper_cpu/eval/dp_synrag/<build> \
        --clusters=60 --json_out=docs/performance/evaluation/bench_build.json
    python -m experiments.bench_build --config=experiments/configs/medical_synth.py:paper_cpu \
        --whole --workdir=runs/bench_whole --json_out=...

Sample mode (--build_dir): reads a finished (or re-ranked) build's settings (its released
config.json) and its clusters S_r (private state), and decodes the clusters with the first
--clusters indices again, from fresh keys, in this process: nothing is written into the build
and nothing is released. The cluster indices are public (0 .. n-1), so the sample mixes empty,
small and full clusters as the build does. Whole mode (--whole) runs build_synthetic_db from
scratch (or resumes) in --workdir and reports its phases. Progress mode (--progress
--workdir=...) builds nothing: it reports a build as it stands (finished, running or cut off)
from its phase log, summed over every run that worked on it.

Sample mode can also plan the build itself (--config and --workdir instead of --build_dir:
clusters chosen with the encoder, nothing decoded) and decode the sample with another model
(--model, --dtype): launch/device_bench.sh times the paper's cluster shapes on a
Llama-3.1-8B-shaped random model that way, where a whole build would take hours.

Both report, in one run: wall seconds per phase (sample mode: compile warm-up and decode),
useful GFLOP/s (only real document rows and the tokens actually decoded: experiments.
benchmarks.nominal_flops per cluster at its decoded length), the fraction of this
machine's matmul peak measured in the same run, the rows decoded against the real ones, and
the process's peak RSS. Figures are aggregates over clusters, never per cluster; but they
count the private clusters (empty ones, real rows), so the report is an evaluation artifact
(dpsynrag_jax.evaluation_artifacts): labelled, not differentially private, and --json_out is
refused beside released files. Its notice goes to stderr; stdout is the report alone.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import time
from typing import Sequence

from absl import app
from absl import flags
import jax
from ml_collections import config_flags

from dpsynrag_jax import benchmarks
from dpsynrag_jax import evaluation_artifacts as artifacts
from dpsynrag_jax import host_memory
from experiments import cli

FLAGS = flags.FLAGS
TOOL = "bench_build"
READS = ("a build's private/ state (cluster members, decoded tokens) and its private "
         "documents: cluster and row counts")


def define_flags() -> None:
  flags.DEFINE_string("build_dir", "", "Sample mode: a build whose clusters are chosen.")
  flags.DEFINE_integer("clusters", 60, "Sample mode: decode this many clusters, from "
                       "--first_cluster on.")
  flags.DEFINE_integer("first_cluster", 0, "Sample mode: index of the sample's first cluster.")
  flags.DEFINE_bool("per_shape", False, "Sample mode: instead, decode one cluster of every "
                    "padded shape the build has (its lowest index): every buffer size a whole "
                    "build allocates, for its peak memory, in minutes instead of hours.")
  flags.DEFINE_bool("warmup", True, "Sample mode: compile every program first (one cluster, or one "
                    "full and one last pack, of each shape).")
  flags.DEFINE_list("row_buckets", [], "Sample mode: decode once per row bucket (e.g. 16,8), "
                    "side by side; empty: the default bucket.")
  flags.DEFINE_list("pack_rows", [], "Sample mode: decode once per private_decode.PACK_ROWS "
                    "value (e.g. 1,96: unpacked, then clusters packed to ~96 rows), side by "
                    "side; empty: the default.")
  flags.DEFINE_string("tokens_out", "", "Sample mode: write the first run's decoded token ids "
                      "per cluster here (JSON), to compare two code versions' draws. They are "
                      "drawn from private documents and charged to no ledger: a work dir "
                      "path, never a published one.")
  flags.DEFINE_integer("max_rows", 0, "Sample mode: keep only the sample's clusters of at most "
                       "this many padded rows (0: all), e.g. the small ones packing acts on.")
  flags.DEFINE_bool("decode", True, "Sample mode: decode the sample; --nodecode reports the "
                    "prefill counts only (prefix_tree), in seconds instead of minutes.")
  flags.DEFINE_string("model", "", "Sample mode: decode with this model instead of the build's "
                      "(a preset, a path, or random:SHAPE of benchmarks.RANDOM_SHAPES, "
                      "e.g. random:llama-3.1-8b on an accelerator); the documents are fitted "
                      "to its tokenizer. Empty: the build's model.")
  flags.DEFINE_string("dtype", "", "Sample mode, with --model: its dtype (e.g. bfloat16); "
                      "empty: the build's.")
  flags.DEFINE_bool("whole", False, "Whole mode: run build_synthetic_db (--config, --workdir).")
  flags.DEFINE_bool("progress", False, "Report a build in --workdir as it stands (finished, "
                    "running or cut off) from its phase log, building nothing.")
  config_flags.DEFINE_config_file("config", None, "Whole mode: build config, e.g. "
                                  "experiments/configs/medical_synth.py:paper_cpu. Sample "
                                  "mode without --build_dir: the build is planned from it "
                                  "in --workdir (clusters chosen, nothing decoded), then "
                                  "sampled.")
  flags.DEFINE_string("workdir", "", "Whole mode: the build's work dir (resumable); sample "
                      "mode with --config: where the build is planned.")
  flags.DEFINE_string("json_out", "", "Where to write the report (JSON): an evaluation "
                      "artifact, refused beside released files (e.g. "
                      "docs/performance/evaluation/NAME.json).")


def prefix_tree(suffixes: Sequence[Sequence[int]]) -> dict:
  """Prefill tokens of one cluster's document suffixes, as prefilled today (every row its own
  suffix) and through a prefix tree (a span shared by several rows' openings prefilled once:
  one token per tree node, the radix-cache count of LLM servers). An upper bound on what
  prefix sharing saves: it ignores how rows are chunked and padded."""
  root: dict = {}
  nodes = 0
  for suffix in suffixes:
    node = root
    for token in suffix:
      if token not in node:
        node[token] = {}
        nodes += 1
      node = node[token]
  return {"tokens": sum(len(s) for s in suffixes), "tree_tokens": nodes}


def prefill_counts(suffixes_of: dict) -> dict:
  """prefix_tree summed over clusters (aggregates only)."""
  trees = [prefix_tree(s) for s in suffixes_of.values() if s]
  tokens = sum(t["tokens"] for t in trees)
  tree = sum(t["tree_tokens"] for t in trees)
  return {"prefill_tokens": tokens, "prefill_tokens_prefix_tree": tree,
          "prefix_tree_saves": 1 - tree / tokens if tokens else 0.0}


def useful_flops(cfg, prefix_len: int, suffixes, steps: int) -> float:
  """Useful work of one cluster: its real rows' prompts and the `steps` tokens it decoded."""
  return benchmarks.nominal_flops(cfg, [prefix_len + len(s) for s in suffixes], steps)


def sample(build_dir: str, num_clusters: int, warmup: bool = True,
           row_buckets: Sequence[int] = (), decode: bool = True,
           per_shape: bool = False, pack_rows: Sequence[int] = (), max_rows: int = 0,
           first_cluster: int = 0, tokens_out: str = "", model: str = "",
           dtype: str = "") -> dict:
  """Times the private decode of clusters 0 .. num_clusters-1 of the build in `build_dir`.

  row_buckets: rows are padded to a multiple of private_decode.ROW_BUCKET; given several
  values, the sample is decoded once per value in this one run (a lever measured side by
  side), and the report counts the clusters whose texts differ from the first value's (the
  same keys and distribution; only float rounding of other padded shapes can move a draw).
  decode False: only the prefill counts (prefill_counts), no decode and no peak measured.
  per_shape: the sample is one cluster of each padded shape of the whole build instead (its
  lowest index; num_clusters is ignored), in ascending shape order as a build runs them; the
  report adds the resident size after the sample, to compare with its peak.
  pack_rows: as row_buckets, for private_decode.PACK_ROWS (1: every cluster alone).
  tokens_out: a path for the first run's token ids per cluster (private; see the flag).
  max_rows: > 0 keeps the non-empty clusters of at most this many padded rows (at the default
  row bucket).
  first_cluster: the sample is clusters first_cluster .. first_cluster + num_clusters - 1.
  model, dtype: decode with this model (e.g. random:llama-3.1-8b in bfloat16: the paper's
  cluster shapes on an accelerator-sized model); the peak is then also measured at dtype.
  """
  from dpsynrag_jax import private_decode  # pylint: disable=g-import-not-at-top
  from dpsynrag_jax.synrag import pipeline  # pylint: disable=g-import-not-at-top
  from dpsynrag_jax.synrag import workdir as wd_lib  # pylint: disable=g-import-not-at-top

  if per_shape:
    num_clusters = len(wd_lib.Workdir(build_dir).selected())
  loaded = benchmarks.load_sample(build_dir, num_clusters, 0 if per_shape else first_cluster,
                                  model, dtype)
  if pipeline.topic_groups(loaded.config):
    raise ValueError("bench_build's sample decodes the paper's prompts; a build with topic "
                     "terms (generation.topic_terms) is timed with --whole only.")
  config, ids, lm = loaded.config, loaded.ids, loaded.lm
  start = time.perf_counter()
  cal = pipeline.calibration_of(config)
  predictor = pipeline._predictor(config, cal, lm)   # pylint: disable=protected-access
  suffixes = {r: predictor.suffixes([loaded.documents[i] for i in loaded.selected[r]])
              for r in ids}
  if per_shape:
    first_of_shape = {}
    for r in ids:
      if suffixes[r]:
        first_of_shape.setdefault(predictor.shape_of(suffixes[r]), r)
    ids = [first_of_shape[shape] for shape in sorted(first_of_shape)]
    suffixes = {r: suffixes[r] for r in ids}
  if max_rows:
    ids = [r for r in ids if suffixes[r] and predictor.shape_of(suffixes[r])[0] <= max_rows]
    suffixes = {r: suffixes[r] for r in ids}
  load_seconds = loaded.seconds + time.perf_counter() - start
  key_of = benchmarks.sample_key_of
  cfg = lm.config
  rows_real = sum(len(suffixes[r]) for r in ids)
  counts = {"mode": "sample_per_shape" if per_shape else "sample",
            "build": os.path.abspath(build_dir), "clusters": len(ids),
            "empty_clusters": sum(1 for r in ids if not suffixes[r]), "rows_real": rows_real,
            "prefix_tokens": len(predictor.prefix), **prefill_counts(suffixes)}
  if not decode:
    return {**counts, "peak_rss_gb": host_memory.peak_resident_gb()}
  peak = benchmarks.matmul_peak(dtype=dtype or "float32")

  runs, first_tokens = [], None
  default_bucket, default_pack = private_decode.ROW_BUCKET, private_decode.PACK_ROWS
  variants = [(int(b), int(p)) for b in list(row_buckets) or [default_bucket]
              for p in list(pack_rows) or [default_pack]]
  try:
    for bucket, pack in variants:
      private_decode.ROW_BUCKET, private_decode.PACK_ROWS = bucket, pack
      shapes = collections.defaultdict(list)
      for r in ids:
        if suffixes[r] or not predictor.decodes_empty_without_model:
          shapes[predictor.shape_of(suffixes[r])].append(r)
      seconds = {"load": load_seconds}
      if warmup:
        # Every program the timed decode runs: per shape, a full pack and the last, smaller
        # pack (decode_many forms exactly these from this many clusters).
        start = time.perf_counter()
        warm = {}
        for shape, rs in shapes.items():
          n = private_decode.pack_size(shape[0])
          warm.update({r: suffixes[r] for r in rs[:min(len(rs), n + len(rs) % n)]})
        private_decode.decode_many(predictor, warm, key_of)
        seconds["warmup"] = time.perf_counter() - start
      start = time.perf_counter()
      tokens = private_decode.decode_many(predictor, suffixes, key_of)
      seconds["decode"] = time.perf_counter() - start
      flops = sum(useful_flops(cfg, len(predictor.prefix), suffixes[r], len(tokens[r]))
                  for r in ids if suffixes[r])
      gflops = flops / seconds["decode"] / 1e9
      if first_tokens is None and tokens_out:
        with open(tokens_out, "w", encoding="utf-8") as f:
          json.dump({str(r): tokens[r] for r in ids}, f)
      first_tokens = first_tokens or tokens
      runs.append({
          "row_bucket": bucket, "pack_rows": pack, "shapes": len(shapes),
          "rows_decoded": sum(shape[0] * len(rs) for shape, rs in shapes.items()),
          "tokens_decoded": int(sum(len(t) for t in tokens.values())),
          "clusters_differing_from_first": sum(tokens[r] != first_tokens[r] for r in ids),
          "seconds": seconds, "seconds_per_real_row": seconds["decode"] / max(rows_real, 1),
          "useful_gflop": flops / 1e9, "useful_gflops_per_s": gflops,
          "fraction_of_peak": gflops / peak["peak"]})
  finally:
    private_decode.ROW_BUCKET, private_decode.PACK_ROWS = default_bucket, default_pack
  return {
      **counts, "model": model or config.model.lm, "dtype": dtype or config.model.dtype,
      "parameters": cfg.num_params(), "c_over_tau": cal.c_over_tau, "T": cal.T, "runs": runs,
      "matmul_peak_gflops_per_s": peak["peak"], "peak_rss_gb": host_memory.peak_resident_gb(),
      "resident_after_gb": host_memory.resident_gb(),
      "backend": jax.default_backend(), "devices": predictor.num_devices,
  }


def plan(config, workdir: str) -> str:
  """Plans the build of `config` in `workdir` (runtime.stop_after_rerank: its clusters chosen,
  nothing decoded; a planned work dir is resumed, not redone) and returns workdir, ready for
  sample(). A whole build on an accelerator-sized model would take hours; its clusters'
  shapes need only the encoder."""
  from dpsynrag_jax.synrag import pipeline  # pylint: disable=g-import-not-at-top
  pipeline.plan_build(config, workdir)
  return workdir


def whole(config, workdir: str) -> dict:
  """Runs (or resumes) build_synthetic_db and reports its phases, peak RSS, and the useful
  GFLOP/s of its decode phase against the matmul peak measured afterwards in this process.

  A resumed run decodes only the clusters missing from the work dir, so the useful work
  counts exactly the clusters this run decoded (`resumed` says whether any were there);
  `all_runs` adds up every run of the build from its phase log (pipeline.read_phase_log): the
  whole build's seconds per phase and useful GFLOP/s, however many runs it took."""
  from dpsynrag_jax.synrag import pipeline  # pylint: disable=g-import-not-at-top
  from dpsynrag_jax.synrag import workdir as wd_lib  # pylint: disable=g-import-not-at-top
  before = set(wd_lib.Workdir(workdir).generated(0)) if os.path.isdir(workdir) else set()
  start = time.perf_counter()
  summary = pipeline.build_synthetic_db(config, workdir)
  wall = time.perf_counter() - start
  rss = host_memory.peak_resident_gb()   # the build's, before this report loads the model again
  seconds = summary.get("seconds", {})
  work = decode_work(workdir, before)
  peak = benchmarks.matmul_peak()
  gflops = work["useful_gflop"] / seconds["decode"] if seconds.get("decode") else 0.0
  return {"mode": "whole", "workdir": os.path.abspath(workdir), "seconds_wall": wall,
          "seconds": seconds, "resumed": bool(before), **work,
          "useful_gflops_per_s": gflops, "matmul_peak_gflops_per_s": peak["peak"],
          "fraction_of_peak": gflops / peak["peak"], "peak_rss_gb": rss,
          "all_runs": progress(workdir, peak["peak"]),
          "backend": jax.default_backend()}


def progress(workdir: str, peak_gflops: float) -> dict:
  """The build in `workdir` so far, over every run that worked on it (finished, running or cut
  off): its phase log summed (pipeline.read_phase_log), the clusters decoded so far and their
  useful GFLOP/s over the decode seconds the log holds for them."""
  from dpsynrag_jax.synrag import pipeline  # pylint: disable=g-import-not-at-top
  from dpsynrag_jax.synrag import workdir as wd_lib  # pylint: disable=g-import-not-at-top
  logged = pipeline.read_phase_log(workdir)
  wd = wd_lib.Workdir(workdir)
  selected = wd.selected()
  if selected:
    work = decode_work(workdir, set(selected) - set(wd.generated(0)))
  else:   # cut off before its clusters were chosen: phases only
    work = {"clusters": 0, "useful_gflop": 0.0}
  decode = logged["seconds"].get("decode", 0.0)
  gflops = work["useful_gflop"] / decode if decode else 0.0
  return {"runs": logged["runs"], "finished": wd.finished, "clusters_planned": len(selected),
          **work, "seconds": logged["seconds"], "seconds_total": sum(logged["seconds"].values()),
          "useful_gflops_per_s": gflops, "matmul_peak_gflops_per_s": peak_gflops,
          "fraction_of_peak": gflops / peak_gflops, "peak_rss_gb": logged["peak_rss_gb"]}


def decode_work(build_dir: str, skip: set) -> dict:
  """Aggregates of a finished build's decode over its clusters not in `skip`: clusters, empty
  ones, real rows, rows decoded (padded to the row bucket), tokens decoded, useful GFLOP."""
  from dpsynrag_jax import private_decode  # pylint: disable=g-import-not-at-top
  from dpsynrag_jax.synrag import pipeline  # pylint: disable=g-import-not-at-top
  from dpsynrag_jax.synrag import topics  # pylint: disable=g-import-not-at-top
  from dpsynrag_jax.synrag import workdir as wd_lib  # pylint: disable=g-import-not-at-top
  loaded = benchmarks.load_sample(build_dir, len(wd_lib.Workdir(build_dir).selected()))
  predictor = pipeline._predictor(loaded.config, pipeline.calibration_of(loaded.config),  # pylint: disable=protected-access
                                  loaded.lm)
  generated = wd_lib.Workdir(build_dir).generated(0)
  ids = [r for r in loaded.ids if r not in skip]
  leads = wd_lib.read_json(wd_lib.Workdir(build_dir).private_path(pipeline.TOPIC_LEADS)) \
      if pipeline.topic_groups(loaded.config) else {}
  lead_ids = {r: topics.lead_token_ids(loaded.lm, leads[r]) if leads else [] for r in ids}
  # Every row read its cluster's topic opening after its prompt (pipeline._decode_all).
  suffixes = {r: [s + lead_ids[r] for s in
                  predictor.suffixes([loaded.documents[i] for i in loaded.selected[r]])]
              for r in ids}
  real = [r for r in ids if suffixes[r]]
  flops = sum(useful_flops(loaded.lm.config, len(predictor.prefix), suffixes[r],
                           len(generated[r])) for r in real)
  return {"clusters": len(ids), "empty_clusters": len(ids) - len(real),
          "rows_real": sum(len(suffixes[r]) for r in real),
          "rows_decoded": sum(predictor.shape_of(suffixes[r], "", lead_ids[r])[0]
                              for r in real),
          "row_bucket": private_decode.ROW_BUCKET,
          "tokens_decoded": sum(len(generated[r]) for r in ids), "useful_gflop": flops / 1e9}


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  cached = cli.start_app()
  artifacts.announce(TOOL, READS, file=sys.stderr)
  if FLAGS.json_out:
    artifacts.check_destination(FLAGS.json_out)   # before the build or the sample runs
  if FLAGS.progress:
    if not FLAGS.workdir:
      raise app.UsageError("--progress needs --workdir.")
    report = {"mode": "progress", "workdir": os.path.abspath(FLAGS.workdir),
              **progress(FLAGS.workdir, benchmarks.matmul_peak()["peak"])}
  elif FLAGS.whole:
    if FLAGS.config is None or not FLAGS.workdir:
      raise app.UsageError("--whole needs --config and --workdir.")
    report = whole(FLAGS.config, FLAGS.workdir)
    # Compiles are part of a build's time: say whether they were loaded from a warm cache.
    report["compilation_cache"] = {"dir": FLAGS.compilation_cache, "entries_before": cached}
  else:
    if not FLAGS.build_dir and (FLAGS.config is None or not FLAGS.workdir):
      raise app.UsageError("Give --build_dir, or --config and --workdir (sample mode), or "
                           "--whole.")
    if FLAGS.dtype and not FLAGS.model:
      raise app.UsageError("--dtype goes with --model (a build's own model keeps its dtype).")
    if FLAGS.tokens_out and "docs" in os.path.abspath(FLAGS.tokens_out).split(os.sep):
      raise app.UsageError("--tokens_out holds private draws: give a work dir path, not docs/.")
    build_dir = FLAGS.build_dir or plan(FLAGS.config, FLAGS.workdir)
    report = sample(build_dir, FLAGS.clusters, FLAGS.warmup,
                    [int(b) for b in FLAGS.row_buckets], FLAGS.decode, FLAGS.per_shape,
                    [int(p) for p in FLAGS.pack_rows], FLAGS.max_rows, FLAGS.first_cluster,
                    FLAGS.tokens_out, FLAGS.model, FLAGS.dtype)
  print(json.dumps({artifacts.FIELD: artifacts.label(TOOL, READS), **report}, indent=1))
  if FLAGS.json_out:
    artifacts.write_json(FLAGS.json_out, report, TOOL, READS, file=sys.stderr)


if __name__ == "__main__":
  define_flags()
  cli.define_compilation_cache()
  cli.run(main)
