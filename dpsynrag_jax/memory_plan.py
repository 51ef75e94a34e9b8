"""What the private decode's compiled programs need on a device, planned without the device.

The private decode (private_decode.py) runs, per group of clusters, a prefill program once per
chunk of PREFILL_CHUNK rows and then one decode program: a while loop of T steps. This module
lowers and compiles those programs for a model shape with abstract arguments (a
jax.ShapeDtypeStruct for every weight, cache buffer and input, so nothing is allocated, and an
8B model plans on a laptop) on the backend at hand, and reads XLA's own analysis of each
compiled program:

  memory_analysis()  bytes of the arguments (weights, cache, inputs), outputs, outputs aliased
                     to donated arguments (the cache), and temporaries (activations, scores);
  cost_analysis()    flops and bytes accessed of one decode step and of one prefill chunk;

and derives from them what a device needs: weights, cache, temporaries, the peak of the group
(its largest program), and the time of a decode step at a device's peak, max(flops / peak
flops, bytes accessed / peak bandwidth) (the roofline bound: no step runs faster).

How the programs are compiled, and why:
- layout "accelerator" (the default) is what a GPU or TPU runs: weights and cache stacked over
  layers, one layer scan (run_decode_loop with unrolled=False, inference.extend). Memory is read
  from these programs. Their cost is read from twins with the layers unrolled over weights held
  per layer (decoder.unstack_params; decoder.forward_unrolled computes the Decoder's arithmetic
  layer by layer): XLA's cost analysis does not count a loop body once per trip, so a layer
  scan's flops come out near one layer's. The decode loop's cost is not read (its body is a
  loop body).
- layout "cpu" is what a CPU runs: weights and cache per layer, decoder.decode_unrolled in the
  loop; memory and cost from the same programs.
- On XLA:CPU (CPU_OPTIONS), bf16 dots are compiled as library fusions on their bf16
  operands, and the decode loop's invariant code stays in the loop. Without that, XLA:CPU
  converts every bf16 weight to f32 before its dot and hoists the copies out of the loops: f32
  copies of the weights among the temporaries (29.7 GB of temporaries for a 16-row
  Llama-3.1-8B decode step, 0.90 GB with the options), which a device with bf16 matmuls never
  makes. Where the options are refused (another XLA), the programs compile without them and
  the report says so (`cpu_options`).

These are the compiled programs' own figures on the backend that compiled them. Buffer
assignment is the backend's: XLA:GPU fuses and schedules differently from XLA:CPU, so its
temporaries can differ (the arguments, outputs and aliasing cannot: they are the programs'
inputs and outputs). On XLA:CPU the layer scan still converts the slice of the current layer's
weights (and cache) to f32 before its matmuls: one layer's weights in f32 among the
temporaries (0.87 GB for Llama-3.1-8B), where a GPU reads the bf16 slice in place or copies it
(at most 0.44 GB).

Bytes accessed: XLA's cost analysis counts an operand read by a fusion whole, even where the
fusion reads one slice of it, so each layer's slice of the stacked cache counts as a read of
the whole cache (with the layers unrolled, L times per step: 707 GB for a 256-row, 504-slot
Llama-3.1-8B step whose weights and cache are 32 GB), and on XLA:CPU the bf16 <-> f32
conversions inside fused dots add their own traffic. The expected time at peak therefore takes
the compiled flops (within 1 % of the least work in fp32; bf16 adds the conversions, counted
as flops) and the least bytes: every weight multiplied, the cache read once, the logits
written and read once (_least_work).

Axis letters: B rows (documents, padded; n clusters of B / n rows each), C cache slots
(P shared-prefix tokens + S suffix bucket + T private tokens), V vocabulary.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Sequence

import jax
import jax.numpy as jnp

from dpsynrag_jax import private_decode
from dpsynrag_jax.models import decoder as decoder_lib
from dpsynrag_jax.models import inference, kv_cache
from dpsynrag_jax.models.config import DecoderConfig
from dpsynrag_jax.models.decoder import Decoder
from dpsynrag_jax.privacy import PrivateTokenSelector

# XLA:CPU options for programs meant for a device with bf16 matmuls (CPU backend only):
# - XLA:CPU compiles a bf16 x bf16 -> bf16 dot (flax Dense in bf16) by converting both operands
#   to f32 first; as a YNNPACK library fusion the dot reads its bf16 operands directly, as a
#   GPU's bf16 matmul does.
# - Loop-invariant code motion would hoist those conversions of the (loop-invariant) weights out
#   of the decode loop before the fusion forms: an f32 copy of every weight alive through the
#   loop (measured: 7x the loop's temporaries without it, on a 2-layer model). Without the pass
#   each step converts inside the fused dot and nothing weight-sized is added; on a device the
#   pass has no weight conversions to hoist.
# - The programs are never run: LLVM's optimisation of their machine code (backend level 0)
#   changes neither the optimised HLO, its buffer assignment nor its cost analysis (checked on
#   the test's model: identical figures) and halves the compile time.
CPU_OPTIONS = {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_DOT",
               "xla_disable_hlo_passes": "while-loop-invariant-code-motion",
               "xla_backend_optimization_level": 0}


@dataclasses.dataclass(frozen=True)
class DeviceSpec:
  """A device's public peak figures: memory, dense bf16 matmul throughput, memory bandwidth."""
  name: str
  memory_bytes: float
  bf16_flops_per_s: float
  bytes_per_s: float


# Public specification figures (SXM parts). Memory is the marketed size read as decimal bytes,
# a little below what CUDA reports for either card, so that a plan errs on the safe side.
# H100 SXM5 80 GB: 989 TFLOP/s dense BF16 Tensor Core (1,979 with 2:4 sparsity), HBM3 3.35 TB/s
# (NVIDIA H100 Tensor Core GPU datasheet).
H100_80GB = DeviceSpec("H100 SXM 80 GB", 80e9, 989e12, 3.35e12)
# H200 SXM 141 GB: the same Hopper compute, 989 TFLOP/s dense BF16 (1,979 sparse), HBM3e
# 4.8 TB/s (NVIDIA H200 Tensor Core GPU datasheet).
H200_141GB = DeviceSpec("H200 SXM 141 GB", 141e9, 989e12, 4.8e12)
DEVICES = (H100_80GB, H200_141GB)

# JAX preallocates this fraction of an accelerator's memory for its arrays by default
# (XLA_PYTHON_CLIENT_MEM_FRACTION); the rest is the CUDA context's and the allocator's.
JAX_MEMORY_FRACTION = 0.75

# The token mechanism the programs are compiled with: the paper's (clip, masked sum, one
# exponential-mechanism draw over the vocabulary). c and tau are constants of the program: other
# values give the same shapes and cost. Options that read a public row add a [B, V] reduction.
PAPER_SELECTOR = PrivateTokenSelector(c=0.106, tau=1.0)

# The programs of a group: one step of the decode loop (its cost is a step's), the loop of T
# steps (what runs), one prefill chunk.
PROGRAMS = ("decode_step", "decode_loop", "prefill_chunk")


def nbytes(tree) -> int:
  """Bytes of every array (or ShapeDtypeStruct) in a pytree."""
  return sum(math.prod(a.shape) * jnp.dtype(a.dtype).itemsize for a in jax.tree.leaves(tree))


def abstract_params(cfg: DecoderConfig, dtype, per_layer: bool = False):
  """ShapeDtypeStructs of the decoder's parameters, layers stacked [L, ...] (as an accelerator
  holds them) or per layer (decoder.unstack_params, as a CPU does): matrices in `dtype`, norm
  scales in float32 (as the model holds them)."""
  def init():
    empty = kv_cache.init_cache(cfg, 1, 0, dtype)
    params = Decoder(cfg, dtype).init(jax.random.PRNGKey(0), jnp.zeros((1, 1), jnp.int32),
                                      empty.k, empty.v, empty.positions, empty.lengths)["params"]
    return decoder_lib.unstack_params(params) if per_layer else params
  return jax.eval_shape(init)


def abstract_cache(cfg: DecoderConfig, rows: int, capacity: int, dtype, per_layer: bool):
  """ShapeDtypeStructs of a KV cache of `rows` rows and `capacity` slots: keys [L, B, K, H, C]
  and values [L, B, K, C, H], or tuples of L per-layer buffers (kv_cache.unstack_layers)."""
  def init():
    cache = kv_cache.init_cache(cfg, rows, capacity, dtype)
    return kv_cache.unstack_layers(cache) if per_layer else cache
  return jax.eval_shape(init)


def matmul_params(cfg: DecoderConfig) -> int:
  """Parameters a token's forward multiplies (cfg.num_params() less the embedding table, which
  is gathered, not multiplied; a tied head is counted as the head)."""
  embedding = 0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size
  return cfg.num_params() - embedding


def _memory(compiled) -> dict:
  m = compiled.memory_analysis()
  out = {"arguments": int(m.argument_size_in_bytes), "outputs": int(m.output_size_in_bytes),
         "aliased": int(m.alias_size_in_bytes), "temporaries": int(m.temp_size_in_bytes),
         "generated_code": int(m.generated_code_size_in_bytes)}
  # Donated arguments aliased to outputs are one buffer: counted once.
  out["total"] = out["arguments"] + out["outputs"] - out["aliased"] + out["temporaries"]
  return out


def _cost(compiled) -> dict:
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost   # older jax: one per module
  return {"flops": float(cost.get("flops", 0.0)),
          "bytes_accessed": float(cost.get("bytes accessed", 0.0))}


def _compile(fn, args, donate: tuple[int, ...]) -> tuple[object, float, bool | None]:
  """jit(fn).lower(*args).compile(): (compiled, seconds, whether CPU_OPTIONS applied: None
  off XLA:CPU). keep_unused: an argument the program does not read is still a buffer the
  device holds."""
  lowered = jax.jit(fn, donate_argnums=donate, keep_unused=True).lower(*args)
  start = time.perf_counter()
  if jax.default_backend() != "cpu":
    return lowered.compile(), time.perf_counter() - start, None
  try:
    return lowered.compile(compiler_options=CPU_OPTIONS), time.perf_counter() - start, True
  except Exception:  # pylint: disable=broad-except
    # An XLA without one of the options: compile as is, and say so.
    return lowered.compile(), time.perf_counter() - start, False


def roofline_seconds(flops: float, bytes_accessed: float, device: DeviceSpec) -> dict:
  """The least time a program can take on `device`: its flops at the peak matmul rate or its
  bytes at the peak bandwidth, whichever takes longer."""
  compute, memory = flops / device.bf16_flops_per_s, bytes_accessed / device.bytes_per_s
  return {"seconds": max(compute, memory), "bound": "compute" if compute >= memory else "memory"}


def plan(cfg: DecoderConfig, dtype, rows: int, *, prefix: int, suffix: int, T: int,
         clusters: int = 1, layout: str = "accelerator",
         chunk: int = private_decode.PREFILL_CHUNK,
         selector=PAPER_SELECTOR, devices: Sequence[DeviceSpec] = DEVICES,
         compile_only: Sequence[str] = PROGRAMS) -> dict:
  """Compiles the private decode's programs for one group shape and reads their analysis.

  Args:
    cfg, dtype: the model (weights and cache in dtype, logits float32).
    rows: B, rows of the batch on one device (all packed clusters together).
    prefix, suffix, T: P shared-prefix tokens, S suffix bucket, T private tokens; the cache
      holds C = P + S + T slots.
    clusters: n clusters packed in the batch (rows % clusters == 0), each with its own draw.
    layout: "accelerator" or "cpu" (module docstring).
    chunk: rows per prefill call (private_decode.PREFILL_CHUNK).
    compile_only: which of PROGRAMS to compile (all by default).

  Returns a dict (JSON-ready; bytes as ints):
    shape: rows, clusters, prefix, suffix, T, capacity, chunk, layout, dtype.
    analytic: weights, cache, cache_per_row, decode_inputs (logits [B, V] f32, masks, keys),
      prefill_inputs (prefix keys and values, logits, a chunk's tokens), matmul_params,
      least_work (the flops and bytes a decode step and a prefill chunk cannot do without).
    programs: decode_step, decode_loop, prefill_chunk, each with memory (arguments, outputs,
      aliased, temporaries, generated_code, total = arguments + outputs - aliased +
      temporaries) and compile_s; decode_step and prefill_chunk with cost (flops,
      bytes_accessed; accelerator layout: from the unrolled twin, compiled in cost_compile_s).
    peak_bytes: the group's largest program compiled (the cache lives across all of them).
    devices: per device, whether peak_bytes fits in JAX_MEMORY_FRACTION of its memory, and
      (when decode_step and prefill_chunk are compiled) the time at peak (roofline_seconds) of
      a decode step, of T steps, of the prefill's ceil(B / chunk) chunks and of the group
      (both): "compiled" from the compiled cost, "expected" from the compiled flops and the
      least bytes (analytic.least_work).
    backend: the backend that compiled the programs; cpu_options: whether every program
      compiled with CPU_OPTIONS (None off XLA:CPU).
  """
  if layout not in ("accelerator", "cpu"):
    raise ValueError(f"layout must be 'accelerator' or 'cpu', got {layout!r}.")
  if rows % clusters:
    raise ValueError(f"rows ({rows}) must be a multiple of clusters ({clusters}).")
  if not compile_only or set(compile_only) - set(PROGRAMS):
    raise ValueError(f"compile_only must name some of {PROGRAMS}, got {compile_only!r}.")
  cpu = layout == "cpu"
  capacity = prefix + suffix + T
  chunk = min(chunk, rows)
  sds = jax.ShapeDtypeStruct
  params = abstract_params(cfg, dtype, per_layer=cpu)
  # The cost twins' weights: per layer, so that no layer is hidden in a loop body.
  unrolled_params = params if cpu else abstract_params(cfg, dtype, per_layer=True)
  cache = abstract_cache(cfg, rows, capacity, dtype, per_layer=cpu)
  logits = sds((rows, cfg.vocab_size), jnp.float32)
  masks = (sds((rows,), jnp.bool_), sds((rows,), jnp.bool_))
  keys = jax.eval_shape(lambda: jnp.stack([jax.random.PRNGKey(0)] * clusters))   # [n, 2]
  prefix_kv = jax.eval_shape(lambda: kv_cache.init_cache(cfg, 1, prefix, dtype))
  prefix_k, prefix_v = prefix_kv.k, prefix_kv.v       # [L, 1, K, H, P], [L, 1, K, P, H]
  chunk_inputs = (sds((), jnp.int32), sds((chunk, suffix), jnp.int32), sds((chunk,), jnp.int32),
                  sds((), jnp.bool_))                 # row0, tokens [b, S], lengths [b], active
  packed = private_decode.PackedSelector(selector, clusters)
  # Placeholders: the programs' shapes do not depend on which ids end a text.
  eos_ids, pad_id = (cfg.vocab_size - 1,), 0

  def decode_step(params, cache, logits, doc_mask, public_mask, keys):
    """One step of the decode loop: the token from the clipped sum, then the model's step."""
    step_keys = packed.fold_in(keys, jnp.zeros((), jnp.int32))
    tokens = packed(step_keys, logits, (doc_mask, public_mask))
    # pylint: disable-next=protected-access
    return inference._one_token_step(params, cfg, dtype, cpu)(cache, tokens)

  def decode_loop(params, cache, logits, doc_mask, public_mask, keys):
    # pylint: disable-next=protected-access
    return private_decode._decode_rows(
        params, cache, logits, doc_mask, public_mask, keys, cfg=cfg, dtype=dtype, T=T,
        selector=selector, eos_ids=eos_ids, pad_id=pad_id, unrolled=cpu)

  def prefill_chunk(params, prefix_k, prefix_v, cache, logits, row0, tokens, lengths, active):
    # pylint: disable-next=protected-access
    return private_decode._prefill_rows(params, prefix_k, prefix_v, cache, logits, tokens,
                                        lengths, row0, active, cfg=cfg, dtype=dtype)

  decode_inputs = (cache, logits) + masks + (keys,)
  prefill_inputs = (prefix_k, prefix_v, cache, logits) + chunk_inputs
  programs, applied = {}, set()
  for name, fn, inputs, donate, with_cost in (
      ("decode_step", decode_step, decode_inputs, (1,), True),
      ("decode_loop", decode_loop, decode_inputs, (1,), False),
      ("prefill_chunk", prefill_chunk, prefill_inputs, (3, 4), True)):
    if name not in compile_only:
      continue
    compiled, seconds, options = _compile(fn, (params,) + inputs, donate)
    applied.add(options)
    programs[name] = {"memory": _memory(compiled), "compile_s": round(seconds, 2)}
    if with_cost and not cpu:
      compiled, seconds, options = _compile(fn, (unrolled_params,) + inputs, donate)
      applied.add(options)
      programs[name]["cost_compile_s"] = round(seconds, 2)
    if with_cost:
      programs[name]["cost"] = _cost(compiled)
    del compiled   # an executable holds host memory; one at a time

  weights, cache_bytes = nbytes(params), nbytes(cache)
  peak = max(p["memory"]["total"] for p in programs.values())
  chunks = -(-rows // chunk)
  floor = _least_work(cfg, dtype, rows, chunk, prefix, suffix, capacity, weights, cache_bytes)
  costs = {}
  if "decode_step" in programs and "prefill_chunk" in programs:
    step_cost, chunk_cost = programs["decode_step"]["cost"], programs["prefill_chunk"]["cost"]
    costs["compiled"] = (step_cost, chunk_cost)
    # The compiled flops with the least bytes: see the module docstring for why the compiled
    # bytes overcount on XLA:CPU.
    costs["expected"] = tuple(
        {"flops": c["flops"], "bytes_accessed": f["bytes_accessed"]}
        for c, f in ((step_cost, floor["decode_step"]), (chunk_cost, floor["prefill_chunk"])))
  per_device = {}
  for device in devices:
    per_device[device.name] = {"fits": peak <= JAX_MEMORY_FRACTION * device.memory_bytes}
    for source, (step_cost, chunk_cost) in costs.items():
      step = roofline_seconds(step_cost["flops"], step_cost["bytes_accessed"], device)
      fill = roofline_seconds(chunk_cost["flops"], chunk_cost["bytes_accessed"], device)
      per_device[device.name][source] = {
          "decode_step_ms": 1e3 * step["seconds"], "decode_step_bound": step["bound"],
          "decode_ms": 1e3 * T * step["seconds"],
          "prefill_ms": 1e3 * chunks * fill["seconds"], "prefill_bound": fill["bound"],
          "group_ms": 1e3 * (T * step["seconds"] + chunks * fill["seconds"])}
  return {
      "shape": {"rows": rows, "clusters": clusters, "prefix": prefix, "suffix": suffix, "T": T,
                "capacity": capacity, "chunk": chunk, "prefill_chunks": chunks,
                "layout": layout, "dtype": jnp.dtype(dtype).name},
      "analytic": {"weights": weights, "cache": cache_bytes, "cache_per_row": cache_bytes / rows,
                   "decode_inputs": nbytes((logits, masks, keys)),
                   "prefill_inputs": nbytes((prefix_k, prefix_v, logits, chunk_inputs)),
                   "matmul_params": matmul_params(cfg), "least_work": floor},
      "programs": programs,
      "peak_bytes": peak,
      "devices": per_device,
      "backend": jax.default_backend(),
      "cpu_options": min(applied) if None not in applied else None,
  }


def _least_work(cfg: DecoderConfig, dtype, rows: int, chunk: int, prefix: int, suffix: int,
                capacity: int, weights: int, cache_bytes: int) -> dict:
  """The work the programs cannot do without, counted from the shapes: flops of every matmul
  and of attention over the slots the program reads, and bytes of every weight multiplied, the
  cache read once and the logits written and read once. The compiled figures add what the
  backend adds (on XLA:CPU, the bf16 <-> f32 conversions inside each fused dot are counted as
  flops and as bytes); a device's real step lies above this floor's time at peak."""
  item = jnp.dtype(dtype).itemsize
  d, v, hd = cfg.hidden_size, cfg.vocab_size, cfg.head_dim
  mm = matmul_params(cfg)
  head = v * d
  embedding_bytes = 0 if cfg.tie_word_embeddings else head * item
  multiplied = weights - embedding_bytes          # every matrix but the gathered table
  attention = lambda queries, keys: 4 * cfg.num_layers * cfg.num_heads * hd * queries * keys
  kv_per_token = 2 * cfg.num_layers * cfg.num_kv_heads * hd * item
  step = {"flops": 2.0 * mm * rows + attention(rows, capacity),
          "bytes_accessed": float(multiplied + rows * d * item + cache_bytes +
                                  2 * rows * v * 4)}
  tokens = chunk * suffix
  # A chunk attends over its own cache (P prefix slots + S) and its S new keys, and computes
  # the head at one position per row; its keys and values are written twice (chunk, cluster).
  fill = {"flops": 2.0 * (mm - head) * tokens + 2.0 * head * chunk +
                   attention(tokens, prefix + 2 * suffix),
          "bytes_accessed": float(multiplied + tokens * d * item + prefix * kv_per_token +
                                  2 * tokens * kv_per_token + chunk * v * 4)}
  return {"decode_step": step, "prefill_chunk": fill}


def rows_that_fit(plans: Sequence[dict], device: DeviceSpec,
                  fraction: float = JAX_MEMORY_FRACTION, multiple: int = 8,
                  program: str | None = None) -> dict:
  """Most rows of one group shape that fit on `device`, from plans of that shape at several
  row counts: a least-squares line bytes = fixed + per_row * rows through their peak_bytes (or
  one program's total, `program`), solved for the budget fraction * memory and rounded down to
  a multiple of `multiple` (private_decode.ROW_BUCKET). The weights are fixed; the cache,
  logits and activations grow with the rows. Returns fixed, per_row, the largest relative miss
  of the line on the plans, and rows."""
  xs = [p["shape"]["rows"] for p in plans]
  ys = [p["peak_bytes"] if program is None else p["programs"][program]["memory"]["total"]
        for p in plans]
  if len(set(xs)) < 2:
    raise ValueError("rows_that_fit needs plans at two or more row counts.")
  mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
  per_row = (sum((x - mx) * (y - my) for x, y in zip(xs, ys)) /
             sum((x - mx) ** 2 for x in xs))
  fixed = my - per_row * mx
  miss = max(abs(fixed + per_row * x - y) / y for x, y in zip(xs, ys))
  budget = fraction * device.memory_bytes
  rows = max(0, int((budget - fixed) // per_row) // multiple * multiple)
  return {"device": device.name, "fraction": fraction, "program": program or "peak",
          "budget_bytes": budget, "fixed_bytes": fixed, "per_row_bytes": per_row,
          "line_max_relative_miss": miss, "rows": rows}
