"""The generation benchmark and the accelerator script, on a CPU-sized random model."""

import json
import math
import os
import subprocess
import sys

from dpsynrag_jax import benchmarks
import numpy as np
import pytest

pytestmark = pytest.mark.slow   # runs the benchmarks

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_useful_flops_count_the_lm_head_only_where_logits_are_sampled():
  cfg = benchmarks.RANDOM_SHAPES["llama-3.1-8b-small"]()
  d, hd, f, v, n = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size, cfg.vocab_size, 2
  per_layer = 2 * d * hd * (2 * cfg.num_heads + 2 * cfg.num_kv_heads) + 6 * d * f
  p, T = 5, 3
  expected = ((p + T) * cfg.num_layers * per_layer + T * 2 * d * v +
              cfg.num_layers * 4 * cfg.num_heads * hd * (p + T) * (p + T + 1) / 2)
  assert benchmarks.nominal_flops(cfg, [p] * n, T) == n * expected


def test_weight_matmul_ceiling_times_every_weight_matmul_of_a_step():
  cfg = benchmarks.RANDOM_SHAPES["llama-3.1-8b-small"]()
  ceiling = benchmarks.weight_matmul_ceiling(cfg, [2, 8], repeats=2)
  assert [row["rows"] for row in ceiling] == [2, 8]
  # Every layer's seven matmuls and the LM head: all parameters but the embedding table.
  matmul_params = cfg.num_params() - cfg.vocab_size * cfg.hidden_size
  for row in ceiling:
    assert row["step_s"] > 0
    assert math.isclose(row["gflops"] * 1e9 * row["step_s"], 2 * row["rows"] * matmul_params,
                        rel_tol=1e-9)
    assert row["torch_gflops"] > 0   # torch is installed for the reference


def test_decode_step_bytes_are_the_cache_and_the_logits_a_step_moves():
  """The formula against the bytes of a real cache of those rows and slots and of the logits."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from dpsynrag_jax.models import kv_cache  # pylint: disable=g-import-not-at-top
  cfg = benchmarks.RANDOM_SHAPES["llama-3.1-8b-small"]()
  rows, slots = 8, 40
  for dtype in (jnp.float32, jnp.bfloat16):
    cache = kv_cache.init_cache(cfg, rows, slots, dtype)
    cache_bytes = cache.k.nbytes + cache.v.nbytes
    logits_bytes = np.zeros((rows, cfg.vocab_size), np.float32).nbytes
    step = benchmarks.decode_step_bytes(cfg, rows, slots, dtype)
    assert step["kv_read"] == cache_bytes
    assert step["kv_write"] == cache_bytes // slots
    assert step["logits"] == 2 * logits_bytes
    assert step["total"] == cache_bytes + cache_bytes // slots + 2 * logits_bytes
  floor = benchmarks.decode_floor(0.5, 2e9, 4.0)
  assert floor == {"weight_matmul_step_s": 0.5, "memory_step_s": 0.5, "step_s": 1.0}


def test_memory_bandwidth_counts_the_bytes_of_each_kernel():
  bandwidth = benchmarks.memory_bandwidth(nbytes=16 * 2**20, repeats=2)
  assert bandwidth["bytes"] == 16 * 2**20
  for name in ("read_gbs", "update_gbs"):
    assert math.isfinite(bandwidth[name]) and bandwidth[name] > 0
  assert bandwidth["peak"] == max(bandwidth["read_gbs"], bandwidth["update_gbs"])
  llc = benchmarks.last_level_cache_bytes()
  assert llc is None or llc > 0


def test_bench_generation_reports_the_floor_below_the_measured_decode():
  from experiments import bench_generation  # pylint: disable=g-import-not-at-top
  T = 4
  report = bench_generation.run("tiny-random", docs=8, T=T, pairs=1, c=0.1, reference=False,
                                ceiling_rows=[], bandwidth_bytes=16 * 2**20)
  report = json.loads(json.dumps(report))   # what --json_out writes
  floor, ours = report["floor"], report["ours"]
  assert "weight_matmul_ceiling" not in report   # --ceiling_rows= still skips the list
  rows, suffix = report["padded_shape_rows_suffix"]
  assert floor["rows"] == rows == 8 and not floor["prefill_included"]
  assert floor["cache_slots"] == report["shared_prefix_tokens"] + suffix + T
  assert floor["bandwidth_gbs"] == report["memory_bandwidth_gbs"]["peak"] > 0
  assert floor["bytes_per_step"]["total"] > floor["bytes_per_step"]["kv_read"] > 0
  assert floor["step_s"] == pytest.approx(
      floor["weight_matmul_step_s"] + floor["bytes_per_step"]["total"] /
      (floor["bandwidth_gbs"] * 1e9))
  assert floor["decode_s"] == pytest.approx(T * floor["step_s"])
  # A floor above the measured decode would be a wrong formula.
  assert 0 < floor["decode_s"] <= ours["decode_median_s"] == floor["ours_decode_s"]
  assert floor["ours_decode_over_floor"] >= 1
  assert floor["with_measured_prefill_s"] <= ours["per_cluster_s"]
  assert f"{floor['ours_decode_over_floor']:.2f} x floor" in bench_generation.floor_line(report)


def test_llama_shape_is_the_8b_model():
  cfg = benchmarks.RANDOM_SHAPES["llama-3.1-8b"]()
  assert abs(cfg.num_params() - 8.03e9) < 0.01e9
  assert cfg.rope.rope_type == "llama3"


def test_device_bench_script_on_cpu_with_the_small_shape(tmp_path):
  out = tmp_path / "bench.json"
  build_out, plan_dir = tmp_path / "build.json", tmp_path / "plan"
  env = {**os.environ, "SHAPE": "llama-3.1-8b-small", "DOCS": "4", "T": "4", "PAIRS": "1",
         "OUT": str(out), "PYTHON": sys.executable, "PLAN_CONFIG": "tiny", "CLUSTERS": "3",
         "PLAN_DIR": str(plan_dir), "BUILD_OUT": str(build_out)}
  proc = subprocess.run(["bash", "launch/device_bench.sh"], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=900, check=False)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "per-cluster seconds: median" in proc.stdout
  report = json.loads(out.read_text())
  assert report["docs"] == 4 and report["T"] == 4 and report["dtype"] == "bfloat16"
  assert report["ours"]["per_cluster_s"] > 0
  assert "reference" not in report
  assert report["floor"]["decode_s"] <= report["ours"]["decode_median_s"]
  assert "reference_decode_over_floor" not in report["floor"]
  # Part 2: the tiny config planned (clusters chosen, nothing decoded or released) and its
  # first 3 clusters decoded on the 8B layout's small shape in bf16.
  assert "build sample: 3 clusters" in proc.stdout and "s per 100 documents" in proc.stdout
  build = json.loads(build_out.read_text())
  # It counts the planned build's private clusters: an evaluation artifact, labelled not DP.
  assert build["evaluation_artifact"]["tool"] == "bench_build"
  assert build["evaluation_artifact"]["differentially_private"] is False
  assert build["model"] == "random:llama-3.1-8b-small" and build["dtype"] == "bfloat16"
  cfg = benchmarks.RANDOM_SHAPES["llama-3.1-8b-small"]()
  assert build["parameters"] == cfg.num_params() and build["T"] == 8
  assert build["clusters"] == 3 and build["rows_real"] > 0
  assert build["runs"][0]["seconds"]["decode"] > 0 and build["runs"][0]["useful_gflop"] > 0
  selected = selected_of(str(plan_dir))
  assert len(selected) == 6 and not os.path.exists(plan_dir / "synthetic_db.jsonl")


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


def _tree_digest(root):
  import hashlib  # pylint: disable=g-import-not-at-top
  h = hashlib.sha256()
  for folder, _, files in sorted(os.walk(root)):
    for name in sorted(files):
      path = os.path.join(folder, name)
      h.update(path.encode())
      with open(path, "rb") as f:
        h.update(f.read())
  return h.hexdigest()


def test_bench_build_decodes_a_public_sample_of_a_real_build(tmp_path):
  """bench_build's whole mode builds a tiny config (interrupted once, so the report counts only
  what the resumed run decoded); its sample mode then counts the sample's real rows, decodes
  at least those, reports useful GFLOP/s against the peak, and leaves the build untouched."""
  from dpsynrag_jax.synrag import pipeline  # pylint: disable=g-import-not-at-top
  from dpsynrag_jax.synrag import workdir as wd_lib  # pylint: disable=g-import-not-at-top
  from experiments import bench_build  # pylint: disable=g-import-not-at-top
  from experiments.configs import medical_synth  # pylint: disable=g-import-not-at-top
  workdir = str(tmp_path / "build")
  config = medical_synth.get_config("tiny")
  config.runtime.stop_after_clusters = 2
  with pytest.raises(pipeline.PipelineInterrupted):
    bench_build.whole(config, workdir)
  first = set(wd_lib.Workdir(workdir).generated(0))
  cut = bench_build.progress(workdir, peak_gflops=100.0)   # the build as it was cut off
  assert not cut["finished"] and cut["runs"] == 1
  assert cut["clusters"] == len(first) and cut["clusters_planned"] == config.clustering.R
  assert cut["seconds"]["decode"] > 0 and cut["seconds"]["embed"] > 0
  assert cut["peak_rss_gb"] > 0.1   # logged by each decode group (this process's, so far)
  config.runtime.stop_after_clusters = -1
  built = bench_build.whole(config, workdir)
  selected = wd_lib.Workdir(workdir).selected()
  rest = [r for r in selected if r not in first]
  assert built["resumed"] and built["clusters"] == len(rest) == config.clustering.R - len(first)
  real = sum(len(selected[r]) for r in rest)
  assert built["rows_real"] == real and built["rows_decoded"] >= real
  assert built["rows_decoded"] % built["row_bucket"] == 0
  assert built["useful_gflop"] > 0 and 0 < built["fraction_of_peak"]
  assert built["seconds"]["decode"] > 0 and built["peak_rss_gb"] > 0
  # Both runs on the phase log: the whole build's decode is more than the first run's groups.
  # (Not compared with the resumed run's "decode" phase: the log sums only its groups' seconds,
  # while the summary rounds the phase around them to 0.1 s.)
  every = built["all_runs"]
  assert every["runs"] == 2 and every["finished"]
  assert every["seconds"]["decode"] > cut["seconds"]["decode"]
  assert every["seconds"]["decode"] <= cut["seconds"]["decode"] + built["seconds"]["decode"] + 0.1
  assert every["seconds"]["load"] > built["seconds"]["load"]
  assert every["clusters"] == config.clustering.R
  assert every["useful_gflop"] >= built["useful_gflop"]   # the first two may be empty
  assert every["seconds_total"] == pytest.approx(sum(every["seconds"].values()))
  assert every["seconds"]["keywords"] >= built["seconds"]["keywords"] - 0.05   # 0.1 s rounding
  # The largest peak any run's groups logged: one process here, so between the cut run's and
  # the one measured after the build.
  assert cut["peak_rss_gb"] <= every["peak_rss_gb"] <= built["peak_rss_gb"] + 1e-3
  before = _tree_digest(workdir)
  report = bench_build.sample(workdir, num_clusters=3, row_buckets=[16, 8])
  assert report["clusters"] == 3
  assert report["rows_real"] == sum(len(selected[r]) for r in range(3))
  sixteen, eight = report["runs"]
  # Padded rows on top of the real ones; a finer bucket pads less.
  assert sixteen["rows_decoded"] >= eight["rows_decoded"] >= report["rows_real"]
  assert all(run["rows_decoded"] % run["row_bucket"] == 0 for run in report["runs"])
  assert sixteen["useful_gflop"] > 0 and 0 < sixteen["fraction_of_peak"]
  assert sixteen["seconds"]["decode"] > 0 and report["peak_rss_gb"] > 0
  assert sixteen["clusters_differing_from_first"] == 0
  assert report["prefill_tokens"] >= report["prefill_tokens_prefix_tree"] > 0
  assert 0 <= eight["clusters_differing_from_first"] <= 3
  # One cluster of each padded shape of the whole build: as many clusters as shapes.
  per_shape = bench_build.sample(workdir, num_clusters=0, warmup=False, per_shape=True)
  assert per_shape["mode"] == "sample_per_shape" and per_shape["empty_clusters"] == 0
  assert per_shape["clusters"] == per_shape["runs"][0]["shapes"] >= 1
  assert per_shape["resident_after_gb"] > 0
  # Clusters 1-5, alone and packed: the same texts (packing changes no cluster's draws).
  packs = bench_build.sample(workdir, num_clusters=5, first_cluster=1, warmup=False,
                             pack_rows=[1, 64], max_rows=64)
  alone, packed = packs["runs"]
  assert (alone["pack_rows"], packed["pack_rows"]) == (1, 64)
  assert 1 <= packs["clusters"] <= 5 and packs["empty_clusters"] == 0
  assert packed["clusters_differing_from_first"] == 0
  assert packed["tokens_decoded"] == alone["tokens_decoded"]
  assert _tree_digest(workdir) == before
  with pytest.raises(ValueError, match="asked for 999"):
    bench_build.sample(workdir, num_clusters=999)
  with pytest.raises(ValueError, match="asked for 6 from cluster 1"):
    bench_build.sample(workdir, num_clusters=6, first_cluster=1)
  _check_decode_variants(workdir, before)


def selected_of(workdir):
  from dpsynrag_jax.synrag import workdir as wd_lib  # pylint: disable=g-import-not-at-top
  return wd_lib.Workdir(workdir).selected()


def _check_decode_variants(workdir, before):
  """decode_variants on the same tiny build: every (variant, eps) row is calibrated to its own
  budget, the paper's method pays every token, the sparse vector test at most svt_paid per text,
  and the build is left untouched."""
  from experiments import decode_variants  # pylint: disable=g-import-not-at-top
  decode_variants.VARIANTS["svt_test"] = {"svt_paid": 3, "svt_threshold": 0.5,
                                          "svt_share": 0.5}
  try:
    report = decode_variants.run(workdir, 4, [10.0, 3.0], ["paper", "svt_test", "topic"])
  finally:
    del decode_variants.VARIANTS["svt_test"]
  rows = {(r["variant"], r["epsilon"]): r for r in report["rows"]}
  assert set(rows) == {(v, e) for v in ("paper", "svt_test", "topic") for e in (10.0, 3.0)}
  for (name, eps), row in rows.items():
    assert row["epsilon_spent_closed_form"] == pytest.approx(eps, rel=1e-9)
    if name == "topic":
      # The terms take part of the budget: a smaller c, every token still paid.
      assert row["epsilon_topic"] > 0 and row["c"] < rows[("paper", eps)]["c"]
      assert row["tokens_paid_share"] == 1.0
      assert row["pure_clusters"] == 0 or 0 <= row["topic_fidelity"] <= 1
    elif name == "paper":
      assert row["tokens_paid_share"] == 1.0 and row["paid_tokens_charged"] == 8
    else:
      assert row["paid_tokens_charged"] == 3
      assert row["tokens_paid_share"] <= 3 * report["clusters"] / row["tokens"] + 1e-9
      # Fewer paid tokens per text buy a larger c at the same budget.
      assert row["c"] > rows[("paper", eps)]["c"]
  assert "| svt_test | 3 |" in decode_variants.markdown(report)
  # The exact expected disease-draw fidelity: a probability, never lower at a larger budget;
  # variants without topic terms have no row.
  expected = decode_variants.expected_topic_fidelity(workdir, [3.0, 10.0], ["paper", "topic"])
  low, high = [r["expected_topic_fidelity"] for r in expected["rows"]]
  assert [r["variant"] for r in expected["rows"]] == ["topic", "topic"]
  assert expected["pure_clusters"] == 0 or 0 <= low <= high <= 1
  # Openings alone, every cluster, then the uniform (epsilon 0) row: recalls in [0, 1].
  recall = decode_variants.openings_recall(workdir, [3.0, 10.0], ["paper", "topic"], num_test=5)
  assert [(r["variant"], r["epsilon"]) for r in recall["rows"]] == [
      ("topic", 3.0), ("topic", 10.0), ("topic", 0.0)]
  assert recall["questions"] == 5 and recall["clusters"] == len(selected_of(workdir))
  assert all(0.0 <= r["openings_recall"] <= 1.0 for r in recall["rows"])
  assert _tree_digest(workdir) == before


def test_prefix_tree_counts_each_shared_opening_once():
  """A span shared by several rows' openings is counted once; a row that is a prefix of
  another adds nothing; distinct rows add all their tokens."""
  from experiments import bench_build  # pylint: disable=g-import-not-at-top
  assert bench_build.prefix_tree([[1, 2, 3], [1, 2, 4], [1, 2]]) == {"tokens": 8,
                                                                    "tree_tokens": 4}
  assert bench_build.prefix_tree([[5, 6], [7, 6]]) == {"tokens": 4, "tree_tokens": 4}
  assert bench_build.prefix_tree([]) == {"tokens": 0, "tree_tokens": 0}
  counts = bench_build.prefill_counts({0: [[1, 2, 3], [1, 2, 4]], 1: [], 2: [[1, 9]]})
  # Clusters are separate trees: cluster 2's [1, 9] shares nothing with cluster 0.
  assert counts["prefill_tokens"] == 8 and counts["prefill_tokens_prefix_tree"] == 6
  assert counts["prefix_tree_saves"] == pytest.approx(0.25)
