"""Whole-pipeline scaling: build_synthetic_db wall time against the number of documents.

    python -m experiments.bench_scaling --sizes=1000,2000,4000 --json_out=scaling.json

Each size runs the `quick` build config (lexical keywords) from scratch in a fresh work dir
with R scaled in proportion to N (R/N fixed at the quick config's 24/2000), so the number of
clusters and decoded rows grow with N while cluster sizes stay put; the models are loaded once and compile
time is left out by a warm-up build at the smallest size. Reports seconds per phase and the
exponent b of time ~ N^b (least squares on log-log).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time

from absl import flags
import numpy as np

from experiments import cli

def scaling_exponent(sizes, seconds) -> float:
  """Slope of log(seconds) against log(size)."""
  return float(np.polyfit(np.log(np.asarray(sizes, float)), np.log(np.asarray(seconds, float)),
                          1)[0])


def build_config(arg: str, n: int, T: int, ratio: float):
  from experiments.configs import medical_synth  # pylint: disable=g-import-not-at-top
  config = medical_synth.get_config(arg)
  config.data.num_documents = n
  config.clustering.R = max(1, round(ratio * n))
  config.generation.T = T
  return config


def run(sizes, T: int, arg: str, ratio: float) -> dict:
  from dpsynrag_jax.models import load_encoder, load_lm  # pylint: disable=g-import-not-at-top
  from dpsynrag_jax.synrag import pipeline  # pylint: disable=g-import-not-at-top
  sizes = sorted(int(s) for s in sizes)
  base = build_config(arg, sizes[0], T, ratio)
  lm, encoder = load_lm(base.model.lm), load_encoder(base.model.encoder)
  runs = []
  with tempfile.TemporaryDirectory() as tmp:
    # Warm-up: compiles the programs the smallest size needs (larger sizes may add buckets).
    pipeline.build_synthetic_db(base, os.path.join(tmp, "warmup"), lm=lm, encoder=encoder)
    for n in sizes:
      config = build_config(arg, n, T, ratio)
      start = time.perf_counter()
      summary = pipeline.build_synthetic_db(config, os.path.join(tmp, str(n)), lm=lm,
                                            encoder=encoder)
      runs.append({"documents": n, "clusters": config.clustering.R,
                   "seconds": time.perf_counter() - start, "phases": summary["seconds"]})
  seconds = [r["seconds"] for r in runs]
  report = {"config": arg, "T": T, "clusters_per_document": ratio, "runs": runs,
            "exponent": scaling_exponent(sizes, seconds) if len(sizes) > 1 else math.nan}
  decode = [r["phases"].get("decode", 0.0) for r in runs]
  if len(sizes) > 1 and all(d > 0 for d in decode):
    report["decode_exponent"] = scaling_exponent(sizes, decode)
  return report


def main(argv):
  del argv
  f = flags.FLAGS
  report = run(f.sizes, f.T, f.config, f.clusters_per_document)
  text = json.dumps(report, indent=1)
  print(text)
  if f.json_out:
    with open(f.json_out, "w", encoding="utf-8") as out:
      out.write(text + "\n")


if __name__ == "__main__":
  # Defined here, not on import, so tests can import this next to bench_generation.
  flags.DEFINE_list("sizes", ["1000", "2000", "4000"], "Numbers of documents.")
  flags.DEFINE_integer("T", 64, "Private tokens per cluster (the demo's 64).")
  flags.DEFINE_string("config", "quick", "medical_synth config arg.")
  flags.DEFINE_float("clusters_per_document", 24 / 2000, "R / N.")
  flags.DEFINE_string("json_out", "", "Where to write the JSON report.")
  cli.run(main)
