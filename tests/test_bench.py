"""The generation benchmark and the accelerator script, on a CPU-sized random model."""

import json
import math
import os
import subprocess
import sys

from experiments import bench_generation
import pytest

pytestmark = pytest.mark.slow   # runs the benchmarks

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_useful_flops_count_the_lm_head_only_where_logits_are_sampled():
  cfg = bench_generation.RANDOM_SHAPES["llama-3.1-8b-small"]()
  d, hd, f, v, n = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size, cfg.vocab_size, 2
  per_layer = 2 * d * hd * (2 * cfg.num_heads + 2 * cfg.num_kv_heads) + 6 * d * f
  p, T = 5, 3
  expected = ((p + T) * cfg.num_layers * per_layer + T * 2 * d * v +
              cfg.num_layers * 4 * cfg.num_heads * hd * (p + T) * (p + T + 1) / 2)
  assert bench_generation.nominal_flops(cfg, [p] * n, T) == n * expected


def test_llama_shape_is_the_8b_model():
  cfg = bench_generation.RANDOM_SHAPES["llama-3.1-8b"]()
  assert abs(cfg.num_params() - 8.03e9) < 0.01e9
  assert cfg.rope.rope_type == "llama3"


def test_device_bench_script_on_cpu_with_the_small_shape(tmp_path):
  out = tmp_path / "bench.json"
  env = {**os.environ, "SHAPE": "llama-3.1-8b-small", "DOCS": "4", "T": "4", "PAIRS": "1",
         "OUT": str(out), "PYTHON": sys.executable}
  proc = subprocess.run(["bash", "launch/device_bench.sh"], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=600, check=False)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "per-cluster seconds: median" in proc.stdout
  report = json.loads(out.read_text())
  assert report["docs"] == 4 and report["T"] == 4 and report["dtype"] == "bfloat16"
  assert report["ours"]["per_cluster_s"] > 0
  assert "reference" not in report


def test_device_bench_refuses_the_8b_shape_on_a_cpu():
  env = {**os.environ, "PYTHON": sys.executable, "JAX_PLATFORMS": "cpu"}
  proc = subprocess.run(["bash", "launch/device_bench.sh"], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=300, check=False)
  assert proc.returncode == 2
  assert "No accelerator" in proc.stderr


def test_scaling_exponent_and_a_tiny_scaling_run():
  from experiments import bench_scaling  # pylint: disable=g-import-not-at-top
  assert abs(bench_scaling.scaling_exponent([1, 2, 4], [3.0, 6.0, 12.0]) - 1.0) < 1e-9
  assert abs(bench_scaling.scaling_exponent([1, 2, 4], [1.0, 4.0, 16.0]) - 2.0) < 1e-9
  report = bench_scaling.run(["100", "200"], T=4, arg="tiny", ratio=0.03)
  assert [r["documents"] for r in report["runs"]] == [100, 200]
  assert [r["clusters"] for r in report["runs"]] == [3, 6]
  assert all(r["seconds"] > 0 and "decode" in r["phases"] for r in report["runs"])
  assert math.isfinite(report["exponent"])
