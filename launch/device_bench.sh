#!/usr/bin/env bash
# The private-decode benchmark on an accelerator, through a randomly initialised
# Llama-3.1-8B-shaped model in bf16 (no download), timed after compilation:
#   1. one cluster of k documents (experiments.bench_generation);
#   2. the first CLUSTERS clusters of a paper-shaped build (the paper_cpu config: Table 6's
#      R 500, L 5, k 80, T 70 on the 8000 Medical notes), planned here with the encoder alone
#      and decoded on the 8B shape (experiments.bench_build): empty, small and full clusters
#      as a build meets them.
#
#   bash launch/device_bench.sh                     # Llama-3.1-8B shape, k = 100, T = 70
#   SHAPE=llama-3.1-8b-small PLAN_CONFIG=tiny bash launch/device_bench.sh   # CPU-sized
#
# Environment: SHAPE, DOCS (k), T, PAIRS (timed clusters), OUT (JSON report of 1),
# PLAN_CONFIG (a medical_synth config arg, default paper_cpu; empty skips 2), CLUSTERS (20),
# PLAN_DIR (the planned build; private state, default under /tmp), BUILD_OUT (JSON report of
# 2), LIMIT_S (hard time limit of each part, default 300), PYTHON.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
SHAPE=${SHAPE:-llama-3.1-8b}
DOCS=${DOCS:-100}
T=${T:-70}
PAIRS=${PAIRS:-3}
OUT=${OUT:-device_bench.json}
PLAN_CONFIG=${PLAN_CONFIG-paper_cpu}
CLUSTERS=${CLUSTERS:-20}
PLAN_DIR=${PLAN_DIR:-/tmp/dpsynrag_device_plan_${PLAN_CONFIG}}
BUILD_OUT=${BUILD_OUT:-device_bench_build.json}
LIMIT_S=${LIMIT_S:-300}

"$PYTHON" -c 'import jax; print("devices:", jax.devices())'
if [[ "$SHAPE" == "llama-3.1-8b" ]] && "$PYTHON" -c \
    'import jax, sys; sys.exit(jax.default_backend() != "cpu")'; then
  echo "No accelerator found: the 8B shape would take hours on a CPU." \
       "Run with SHAPE=llama-3.1-8b-small to test the script here." >&2
  exit 2
fi

start=$(date +%s)
timeout "$LIMIT_S" "$PYTHON" -m experiments.bench_generation \
  --model="random:$SHAPE" --dtype=bfloat16 --docs="$DOCS" --T="$T" --pairs="$PAIRS" \
  --noreference --json_out="$OUT" > /dev/null
"$PYTHON" - "$OUT" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
o = r["ours"]
print(f"shape={r['model']} params={r['parameters'] / 1e9:.2f}B docs={r['docs']} T={r['T']} "
      f"dtype={r['dtype']} devices={r['devices']}")
print(f"per-cluster seconds: median {o['per_cluster_s']:.3f} (runs {o['all_s']}); "
      f"prefill {o['prefill_median_s']:.3f} s; compile + first run "
      f"{o['compile_plus_first_run_s']:.1f} s; load {r['load_s']:.1f} s")
print(f"tokens/s {o['tokens_per_s']:.0f}; {o['gflops']:.0f} GFLOP/s = "
      f"{100 * o['fraction_of_peak']:.1f}% of the measured matmul peak "
      f"({r['matmul_peak_gflops']['peak']:.0f} GFLOP/s)")
PY
echo "wall seconds: $(( $(date +%s) - start ))"

[[ -z "$PLAN_CONFIG" ]] && exit 0
start=$(date +%s)
timeout "$LIMIT_S" "$PYTHON" -m experiments.bench_build \
  --config="experiments/configs/medical_synth.py:$PLAN_CONFIG" --workdir="$PLAN_DIR" \
  --clusters="$CLUSTERS" --model="random:$SHAPE" --dtype=bfloat16 \
  --json_out="$BUILD_OUT" > /dev/null
"$PYTHON" - "$BUILD_OUT" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
run = r["runs"][0]
decoded = r["clusters"] - r["empty_clusters"]
s = run["seconds"]
print(f"build sample: {r['clusters']} clusters of {r['build']} ({r['empty_clusters']} empty), "
      f"{r['rows_real']} document rows, model {r['model']} {r['dtype']}, T {r['T']}")
print(f"decode {s['decode']:.2f} s (warm-up {s.get('warmup', 0):.1f} s, load {s['load']:.1f} s): "
      f"{s['decode'] / max(decoded, 1):.3f} s per non-empty cluster, "
      f"{100 * run['seconds_per_real_row']:.3f} s per 100 documents; "
      f"{run['tokens_decoded'] / s['decode']:.0f} texts' tokens/s")
print(f"{run['useful_gflops_per_s']:.0f} useful GFLOP/s = {100 * run['fraction_of_peak']:.1f}% "
      f"of the measured matmul peak ({r['matmul_peak_gflops_per_s']:.0f} GFLOP/s)")
PY
echo "wall seconds: $(( $(date +%s) - start ))"
