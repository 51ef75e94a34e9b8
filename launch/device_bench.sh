#!/usr/bin/env bash
# The private-decode benchmark on an accelerator: one cluster of k documents through a
# randomly initialised Llama-3.1-8B-shaped model in bf16 (no download), timed after compilation.
#
#   bash launch/device_bench.sh                     # Llama-3.1-8B shape, k = 100, T = 70
#   SHAPE=llama-3.1-8b-small bash launch/device_bench.sh   # the same layout, CPU-sized
#
# Environment: SHAPE, DOCS (k), T, PAIRS (timed clusters), OUT (JSON report), LIMIT_S (hard
# time limit, default 300), PYTHON. Prints per-cluster seconds and writes the JSON report.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
SHAPE=${SHAPE:-llama-3.1-8b}
DOCS=${DOCS:-100}
T=${T:-70}
PAIRS=${PAIRS:-3}
OUT=${OUT:-device_bench.json}
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
