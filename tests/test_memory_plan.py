"""memory_plan on a tiny Llama-shaped config: the compiled programs' analysis against bytes and
flops counted from the shapes alone."""

import jax.numpy as jnp
import pytest

from dpsynrag_jax import memory_plan
from dpsynrag_jax.models.config import DecoderConfig

# Weights large against a 16-row step's activations, as in the models planned for.
CFG = DecoderConfig(model_type="llama", vocab_size=1024, hidden_size=128, intermediate_size=512,
                    num_layers=4, num_heads=4, num_kv_heads=2, head_dim=32)
P, S, T = 8, 16, 8
C = P + S + T


@pytest.fixture(scope="module")
def plans():
  plan = lambda dtype, rows, only=memory_plan.PROGRAMS: memory_plan.plan(
      CFG, dtype, rows, prefix=P, suffix=S, T=T, compile_only=only)
  # Every program once; the other two shapes compile the decode step only (time).
  return {("bf16", 16): plan(jnp.bfloat16, 16),
          ("bf16", 32): plan(jnp.bfloat16, 32, ["decode_step"]),
          ("fp32", 16): plan(jnp.float32, 16, ["decode_step"])}


def _norm_bytes():
  return 4 * (2 * CFG.num_layers + 1) * CFG.hidden_size   # RMSNorm scales stay float32


def _cache_bytes(rows, item):
  kv = 2 * CFG.num_layers * rows * CFG.num_kv_heads * CFG.head_dim * C * item
  return kv + 4 * rows * C + 4 * rows + 4          # + positions [B, C], lengths [B], cursor


def test_weights_and_cache_are_what_the_shapes_hold(plans):
  for (name, rows), plan in plans.items():
    item = 2 if name == "bf16" else 4
    assert plan["analytic"]["weights"] == item * CFG.num_params() + _norm_bytes()
    assert plan["analytic"]["cache"] == _cache_bytes(rows, item)


def test_compiled_arguments_are_weights_cache_and_inputs(plans):
  for plan in plans.values():
    a, prog = plan["analytic"], plan["programs"]
    for name in ("decode_step", "decode_loop"):
      if name in prog:
        assert prog[name]["memory"]["arguments"] == (a["weights"] + a["cache"] +
                                                     a["decode_inputs"])
    if "prefill_chunk" in prog:
      assert prog["prefill_chunk"]["memory"]["arguments"] == (a["weights"] + a["cache"] +
                                                              a["prefill_inputs"])


def test_the_donated_cache_is_updated_in_place(plans):
  plan = plans[("bf16", 16)]
  a, prog = plan["analytic"], plan["programs"]
  assert prog["decode_step"]["memory"]["aliased"] == a["cache"]
  assert prog["decode_loop"]["memory"]["aliased"] == a["cache"]
  # The prefill also donates the cluster's logits [B, V] float32, which it fills.
  assert prog["prefill_chunk"]["memory"]["aliased"] == a["cache"] + 4 * 16 * CFG.vocab_size


def test_cache_and_arguments_grow_linearly_with_rows(plans):
  small, large = plans[("bf16", 16)], plans[("bf16", 32)]
  assert large["analytic"]["cache"] - 4 == 2 * (small["analytic"]["cache"] - 4)   # cursor once
  # 16 more rows: their keys and values, positions, length, logits row and two mask entries.
  per_row = (2 * CFG.num_layers * CFG.num_kv_heads * CFG.head_dim * C * 2 + 4 * C + 4 +
             4 * CFG.vocab_size + 2)
  grown = (large["programs"]["decode_step"]["memory"]["arguments"] -
           small["programs"]["decode_step"]["memory"]["arguments"])
  assert grown == 16 * per_row
  # The step's whole footprint grows by more: its logits output and activations per row.
  steps = [{"shape": p["shape"], "peak_bytes": p["programs"]["decode_step"]["memory"]["total"]}
           for p in (small, large)]
  fit = memory_plan.rows_that_fit(steps, memory_plan.H100_80GB)
  assert fit["per_row_bytes"] > per_row + 4 * CFG.vocab_size
  assert fit["rows"] % 8 == 0 and fit["rows"] > 1000


def test_bf16_halves_the_weights_and_cache_of_fp32(plans):
  bf16, fp32 = plans[("bf16", 16)], plans[("fp32", 16)]
  norms = _norm_bytes()
  assert fp32["analytic"]["weights"] - norms == 2 * (bf16["analytic"]["weights"] - norms)
  kv = lambda p: p["analytic"]["cache"] - 4 * 16 * C - 4 * 16 - 4
  assert kv(fp32) == 2 * kv(bf16)
  saved = (fp32["programs"]["decode_step"]["memory"]["arguments"] -
           bf16["programs"]["decode_step"]["memory"]["arguments"])
  assert saved == (bf16["analytic"]["weights"] - norms) + kv(bf16)


def test_a_decode_step_costs_two_flops_per_weight_and_row(plans):
  for (name, rows), plan in plans.items():
    flops = plan["programs"]["decode_step"]["cost"]["flops"]
    least = plan["analytic"]["least_work"]["decode_step"]["flops"]
    matmuls = 2 * memory_plan.matmul_params(CFG) * rows
    # Every weight is multiplied once per row (the layers are unrolled, so all are counted),
    # plus attention over C slots; bf16 adds the conversions inside each fused dot.
    assert matmuls <= least <= flops
    assert flops <= (1.2 if name == "bf16" else 1.05) * least, (name, flops / least)
  assert (plans[("bf16", 32)]["programs"]["decode_step"]["cost"]["flops"] ==
          pytest.approx(2 * plans[("bf16", 16)]["programs"]["decode_step"]["cost"]["flops"],
                        rel=0.05))


def test_no_f32_copy_of_the_bf16_weights_among_the_temporaries(plans):
  # XLA:CPU's default compile converts every bf16 weight to f32 (twice the weights' bytes) and
  # hoists the copies out of the loops; with memory_plan's options only the current layer's
  # slice is converted (in f32: two fifths of the weights' bytes here). A device with bf16
  # matmuls converts none.
  plan = plans[("bf16", 16)]
  assert plan["cpu_options"]
  for name in ("decode_step", "decode_loop", "prefill_chunk"):
    assert plan["programs"][name]["memory"]["temporaries"] < plan["analytic"]["weights"], name


def test_time_at_peak_is_the_slower_of_compute_and_memory():
  device = memory_plan.DeviceSpec("x", 1e9, 1e12, 1e9)
  assert memory_plan.roofline_seconds(2e12, 1e9, device) == {"seconds": 2.0,
                                                            "bound": "compute"}
  assert memory_plan.roofline_seconds(1e12, 3e9, device) == {"seconds": 3.0, "bound": "memory"}


def test_rows_that_fit_solves_the_line_for_the_budget():
  plans = [{"shape": {"rows": r}, "peak_bytes": 1e9 + 1e6 * r} for r in (16, 32, 64)]
  fit = memory_plan.rows_that_fit(plans, memory_plan.DeviceSpec("x", 2e9, 1, 1), fraction=0.5)
  assert fit["fixed_bytes"] == pytest.approx(1e9)
  assert fit["per_row_bytes"] == pytest.approx(1e6)
  assert fit["rows"] == 0          # the budget (1e9) holds the fixed part only
  fit = memory_plan.rows_that_fit(plans, memory_plan.DeviceSpec("x", 2e9, 1, 1), fraction=1.0)
  assert fit["rows"] == 1000 and fit["line_max_relative_miss"] < 1e-9
