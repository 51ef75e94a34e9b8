"""Helpers the benchmark apps share (experiments/bench_*.py, experiments/decode_variants.py).

  models       RANDOM_SHAPES (random:SHAPE, e.g. a Llama-3.1-8B-shaped random model) and
               load_model (a preset, a path, or random:SHAPE)
  the machine  matmul_peak (measured GFLOP/s of a matmul), memory_bandwidth (measured GB/s of a
               streaming read and update) and weight_matmul_ceiling (one decode step's weight
               matmuls alone); nominal_flops (the useful work of a cluster)
  the floor    decode_step_bytes (what a decode step moves besides the weights) and
               decode_floor (matmuls alone + those bytes at the measured bandwidth)
  one cluster  Ours (the pipeline's cluster program, T steps; its decode alone for
               profile_decode) and Reference (transformers + PyTorch, eager): the two
               decoders bench_generation times against each other
  a build      load_sample (a public sample of a build's clusters: its settings, model,
               documents and members) and sample_key_of (fresh keys for decoding it again)
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import time

from absl import app
import jax
import jax.numpy as jnp
import numpy as np


def _llama31_8b(**overrides):
  from dpsynrag_jax.models.config import DecoderConfig, RopeConfig  # pylint: disable=g-import-not-at-top
  shape = dict(model_type="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
               num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128, rms_norm_eps=1e-5,
               rope=RopeConfig(theta=500000.0, rope_type="llama3", factor=8.0,
                               low_freq_factor=1.0, high_freq_factor=4.0,
                               original_max_position_embeddings=8192),
               max_position_embeddings=131072)
  return DecoderConfig(**{**shape, **overrides})


# Shapes for random:SHAPE. "-small" keeps the layout (GQA 4:1, llama3 RoPE, full vocabulary) at a
# width and depth a CPU runs in seconds, to test the accelerator script anywhere.
RANDOM_SHAPES = {
    "llama-3.1-8b": _llama31_8b,
    "llama-3.1-8b-small": lambda: _llama31_8b(hidden_size=256, intermediate_size=896,
                                              num_layers=2, num_heads=8, num_kv_heads=2,
                                              head_dim=32),
}


def load_model(model: str, dtype):
  """A preset/path through load_lm, or random:SHAPE with the embedded SmolLM2 tokenizer."""
  from dpsynrag_jax.models import load_lm, random_lm  # pylint: disable=g-import-not-at-top
  if not model.startswith("random:"):
    return load_lm(model, dtype=dtype)
  shape = model[len("random:"):]
  if shape not in RANDOM_SHAPES:
    raise app.UsageError(f"Unknown shape {shape!r}; expected one of {sorted(RANDOM_SHAPES)}.")
  tokenizer = load_lm("tiny-random").tokenizer  # token ids < 49152 fit any larger vocabulary
  return random_lm(RANDOM_SHAPES[shape](), seed=0, dtype=dtype, tokenizer=tokenizer,
                   eos_ids=(tokenizer.eos_token_id,))


def _warm_timings(fn, repeats: int) -> list[float]:
  """Seconds of `repeats` calls of fn after one untimed call (compilation, first touch)."""
  fn()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return times


def matmul_peak(n: int = 2048, repeats: int = 5, dtype: str = "float32") -> dict:
  """Best GFLOP/s of an n x n matmul: fp32 in NumPy, JAX and PyTorch (when installed), and in
  JAX at `dtype` too when it is not fp32 (an accelerator's bf16 peak)."""
  rng = np.random.default_rng(0)
  a, b = rng.standard_normal((n, n), np.float32), rng.standard_normal((n, n), np.float32)
  flops = 2.0 * n**3

  best = lambda fn: flops / min(_warm_timings(fn, repeats)) / 1e9

  mm = jax.jit(jnp.matmul)
  out = {"n": n, "numpy": best(lambda: a @ b)}
  ja, jb = jnp.asarray(a), jnp.asarray(b)
  out["jax"] = best(lambda: mm(ja, jb).block_until_ready())
  if dtype != "float32":
    ha, hb = ja.astype(dtype), jb.astype(dtype)
    out[f"jax_{dtype}"] = best(lambda: mm(ha, hb).block_until_ready())
  try:
    import torch  # pylint: disable=g-import-not-at-top
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    out["torch"] = best(lambda: ta @ tb)
  except ImportError:  # an accelerator image may carry JAX only
    pass
  out["peak"] = max(v for k, v in out.items() if k != "n")
  return out


def last_level_cache_bytes() -> int | None:
  """The largest CPU cache Linux's sysfs reports for cpu0 (the last level), or None."""
  folder = "/sys/devices/system/cpu/cpu0/cache"
  units = {"K": 2**10, "M": 2**20, "G": 2**30}
  sizes = []
  try:
    for index in os.listdir(folder):
      with open(os.path.join(folder, index, "size"), encoding="ascii") as f:
        text = f.read().strip()
      sizes.append(int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text))
  except (OSError, ValueError):
    return None
  return max(sizes, default=None)


def memory_bandwidth(nbytes: int | None = None, repeats: int = 5) -> dict:
  """Best GB/s of two jitted streaming kernels over one fp32 array of about nbytes bytes, on the
  default device:

    read    jnp.sum of the array; counts nbytes (read) per call;
    update  x -> x / 2 + 1 into the array's own (donated) buffer; counts 2 x nbytes (read and
            written) per call. Donation keeps the write in place: a fresh output buffer would
            time the page faults of its first touch as well.

  Bytes are what the kernel must move, not cache lines the hardware moves besides. nbytes
  defaults, on a CPU, to 4 x the last-level cache (at least 256 MiB, at most 4 GiB), so that the
  array streams from memory; on an accelerator to 1 GiB (20 x an H100's L2). Each kernel: the
  shortest of `repeats` calls after one untimed call. Returns {"bytes", "read_gbs",
  "update_gbs", "peak": the larger of the two}."""
  if nbytes is None:
    if jax.default_backend() == "cpu":
      nbytes = min(max(4 * (last_level_cache_bytes() or 0), 2**28), 2**32)
    else:
      nbytes = 2**30
  n = max(1, nbytes // 4)
  x = jnp.ones((n,), jnp.float32)
  total = jax.jit(jnp.sum)
  read_s = min(_warm_timings(lambda: total(x).block_until_ready(), repeats))
  update = jax.jit(lambda a: a * 0.5 + 1.0, donate_argnums=0)   # stays finite (tends to 2)
  state = {"x": x}
  del x

  def update_once():
    state["x"] = update(state["x"]).block_until_ready()

  update_s = min(_warm_timings(update_once, repeats))
  del state
  out = {"bytes": 4 * n, "read_gbs": 4 * n / read_s / 1e9,
         "update_gbs": 2 * 4 * n / update_s / 1e9}
  out["peak"] = max(out["read_gbs"], out["update_gbs"])
  return out


def decode_step_bytes(cfg, rows: int, cache_slots: int, cache_dtype) -> dict:
  """Bytes one decode step of `rows` rows moves besides the weights, at the least:

    kv_read   the cache's keys and values, every slot the step attends over: rows x
              cache_slots x layers x 2 x kv_heads x head_dim x the cache dtype's bytes;
    kv_write  the new token's keys and values: the same for one slot;
    logits    the fp32 logits [rows, V], written by the LM head and read by the clipped sum:
              2 x rows x V x 4.

  Left out: the activations between the weight matmuls ([rows, D], [rows, F]), whose traffic
  is in the matmuls' measured time, and the attention scores [rows, heads, cache_slots] of one
  layer, a few hundred KB that stay in cache. Returns the three and their total."""
  per_slot = cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * jnp.dtype(cache_dtype).itemsize
  out = {"kv_read": rows * cache_slots * per_slot, "kv_write": rows * per_slot,
         "logits": 2 * rows * cfg.vocab_size * 4}
  out["total"] = sum(out.values())
  return out


def decode_floor(matmul_step_s: float, step_bytes: int, bandwidth_gbs: float) -> dict:
  """The floor of one decode step: its weight matmuls alone (weight_matmul_ceiling's step_s,
  weight traffic included) followed by its other bytes (decode_step_bytes' total) at the
  measured bandwidth, with attention arithmetic, norms, RoPE and sampling free. Seconds."""
  memory_s = step_bytes / (bandwidth_gbs * 1e9)
  return {"weight_matmul_step_s": matmul_step_s, "memory_step_s": memory_s,
          "step_s": matmul_step_s + memory_s}


def weight_matmul_ceiling(cfg, rows, dtype: str = "float32", repeats: int = 7) -> list[dict]:
  """What one decode step's weight matmuls alone reach at each row count: q, k, v, o, gate, up
  and down of every layer and the LM head, chained as the decoder chains them (jitted, layers
  unrolled), with attention, norms, RoPE and sampling left out. No decode step of ours can
  beat this GFLOP/s on this machine. The same chain in PyTorch (fp32, when installed) says
  whether another matmul kernel would do better at these shapes.

  Random weights of cfg's shapes; x [rows, D]. Returns one dict per row count: rows, median
  seconds per step and GFLOP/s (2 * rows * matmul parameters per step), and torch_gflops."""
  d, f, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
  shapes = {"q": (d, cfg.num_heads * hd), "k": (d, cfg.num_kv_heads * hd),
            "v": (d, cfg.num_kv_heads * hd), "o": (cfg.num_heads * hd, d),
            "gate": (d, f), "up": (d, f), "down": (f, d)}
  rng = np.random.default_rng(0)
  init = lambda shape: (rng.standard_normal(shape, np.float32) / np.sqrt(shape[0])).astype(
      np.float32)
  layers = [{name: init(shape) for name, shape in shapes.items()}
            for _ in range(cfg.num_layers)]
  head = init((d, cfg.vocab_size))
  per_step = sum(a * b for a, b in shapes.values()) * cfg.num_layers + d * cfg.vocab_size

  def chain(x, layers, head, silu, lm_head):
    new_kv = []
    for w in layers:
      q, k, v = x @ w["q"], x @ w["k"], x @ w["v"]
      new_kv.append((k, v))   # a decode step writes them into the cache: keep them live
      x = x + q @ w["o"]
      x = x + (silu(x @ w["gate"]) * (x @ w["up"])) @ w["down"]
    return lm_head(x, head), new_kv

  median_seconds = lambda fn: statistics.median(_warm_timings(fn, repeats))

  # fp32 logits whatever the weights' dtype, as the decoder's own LM head computes them (a bf16
  # product written as bf16 takes a much slower path on XLA:CPU).
  jax_head = lambda x, head: jnp.dot(x, head, preferred_element_type=jnp.float32)
  step = jax.jit(lambda x, layers, head: chain(x, layers, head, jax.nn.silu, jax_head))
  j_layers = jax.tree_util.tree_map(lambda w: jnp.asarray(w, dtype), layers)
  j_head = jnp.asarray(head, dtype)
  try:
    import torch  # pylint: disable=g-import-not-at-top
    t_layers = jax.tree_util.tree_map(torch.from_numpy, layers)
    t_head = torch.from_numpy(head)
  except ImportError:
    torch = None
  out = []
  for n in rows:
    x = rng.standard_normal((n, d), np.float32)
    jx = jnp.asarray(x, dtype)
    seconds = median_seconds(lambda: jax.block_until_ready(step(jx, j_layers, j_head)))
    row = {"rows": n, "step_s": seconds, "gflops": 2.0 * n * per_step / seconds / 1e9}
    if torch is not None:
      tx = torch.from_numpy(x)
      with torch.no_grad():
        t_seconds = median_seconds(
            lambda: chain(tx, t_layers, t_head, torch.nn.functional.silu, torch.matmul))
      row["torch_gflops"] = 2.0 * n * per_step / t_seconds / 1e9
    out.append(row)
  return out


def nominal_flops(cfg, prompt_lengths, T: int) -> float:
  """The useful work of a cluster: weight matmuls and attention (QK and PV) for every row's prompt
  and T tokens, and the LM head for the T positions whose logits are sampled from (a prompt's
  other positions need no logits; an implementation that computes them does extra work)."""
  d, hd = cfg.hidden_size, cfg.head_dim
  per_layer = 2 * d * hd * (2 * cfg.num_heads + 2 * cfg.num_kv_heads) + 6 * d * cfg.intermediate_size
  total = 0.0
  for p in prompt_lengths:
    tokens = p + T
    total += tokens * cfg.num_layers * per_layer + T * 2 * d * cfg.vocab_size
    # Token at position i attends to i + 1 keys: 4 * H * hd flops per key per layer.
    total += cfg.num_layers * 4 * cfg.num_heads * hd * tokens * (tokens + 1) / 2
  return total


class Ours:
  """The pipeline's own cluster program, with EOS disabled so it always runs T steps."""

  def __init__(self, lm, documents, T, c):
    from dpsynrag_jax.models import LanguageModel  # pylint: disable=g-import-not-at-top
    from dpsynrag_jax import private_decode as pp  # pylint: disable=g-import-not-at-top
    no_eos = LanguageModel(lm.config, lm.params, lm.tokenizer, lm.dtype, eos_ids=(-1,),
                           source=lm.source)
    self.predictor = pp.PrivatePredictor(no_eos, c=c, tau=1.0, T=T)
    self.suffixes = self.predictor.suffixes(documents)
    self.shape = self.predictor.shape_of(self.suffixes)
    # The cluster's cache (shared prefix, padded suffix, T tokens): every decode step attends
    # over all its slots.
    self.cache_slots = self.predictor._static(*self.shape).capacity  # pylint: disable=protected-access
    self.key = jax.random.PRNGKey(0)

  def prefill(self) -> float:
    """Seconds of the prefill phase alone (the chunked suffix prefill after the prefix)."""
    arrays = self.predictor.pack_group([self.suffixes], self.shape)
    start = time.perf_counter()
    jax.block_until_ready(self.predictor.prefill_group(arrays))
    return time.perf_counter() - start

  def run(self) -> float:
    start = time.perf_counter()
    self.predictor.decode_group([self.suffixes], [self.key], self.shape)
    return time.perf_counter() - start

  def prefilled_decode(self):
    """The cluster prefilled, and its decode program with inputs: (program, args) for one
    call of the T steps alone (the args' cache is donated; see PrivatePredictor)."""
    arrays = self.predictor.pack_group([self.suffixes], self.shape)
    return self.predictor.prefilled_decode(arrays, [self.key])


class Reference:
  """transformers + PyTorch, eager, as a user would write the private decode."""

  def __init__(self, model_path, prompts_ids, T, c, pad_id):
    import torch  # pylint: disable=g-import-not-at-top
    from transformers import AutoModelForCausalLM  # pylint: disable=g-import-not-at-top
    self.torch = torch
    torch.set_num_threads(os.cpu_count() or 1)
    folder, name = model_path.rsplit("/", 1)
    self.model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name,
                                                      dtype=torch.float32).eval()
    self.T, self.c = T, c
    width = max(map(len, prompts_ids))
    ids = torch.full((len(prompts_ids), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts_ids):  # left padding: every row's next token is at the end
      ids[i, width - len(p):] = torch.tensor(p)
      mask[i, width - len(p):] = 1
    self.ids, self.mask = ids, mask
    self.generator = torch.Generator().manual_seed(0)

  def _clip(self, logits):
    torch = self.torch
    l_exp = torch.exp(logits - logits.max(dim=-1, keepdim=True).values)
    centre = (l_exp.max(dim=-1, keepdim=True).values + l_exp.min(dim=-1, keepdim=True).values) / 2
    l_cent = l_exp - centre
    norm = l_cent.abs().max(dim=-1, keepdim=True).values
    return l_cent * torch.clamp(self.c / norm, max=1.0)

  def run(self) -> tuple[float, float]:
    torch = self.torch
    with torch.inference_mode():
      start = time.perf_counter()
      mask = self.mask.clone()
      positions = (mask.cumsum(-1) - 1).clamp(min=0)
      out = self.model(input_ids=self.ids, attention_mask=mask, position_ids=positions,
                       use_cache=True)
      prefill = time.perf_counter() - start
      past, logits = out.past_key_values, out.logits[:, -1].float()
      for _ in range(self.T):
        summed = self._clip(logits).sum(0)  # every row is a real document here
        token = torch.multinomial(torch.softmax(summed, -1), 1, generator=self.generator)
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        positions = positions[:, -1:] + 1
        out = self.model(input_ids=token.expand(len(mask), 1), attention_mask=mask,
                         position_ids=positions, past_key_values=past, use_cache=True)
        past, logits = out.past_key_values, out.logits[:, -1].float()
      return prefill, time.perf_counter() - start


def config_of_build(build_dir: str):
  import ml_collections  # pylint: disable=g-import-not-at-top
  from dpsynrag_jax.synrag import workdir as wd_lib  # pylint: disable=g-import-not-at-top
  with open(os.path.join(build_dir, wd_lib.CONFIG), encoding="utf-8") as f:
    return ml_collections.ConfigDict(json.load(f))


@dataclasses.dataclass
class Sample:
  """A public sample of a build's clusters (indices 0 .. n-1) and what decoding them needs."""
  config: object            # the build's settings (its released config.json)
  lm: object
  documents: list
  selected: dict            # cluster -> member document ids (private build state)
  ids: list                 # the sampled cluster indices present in the build
  seconds: float            # loading


def load_sample(build_dir: str, num_clusters: int, first: int = 0, model: str = "",
                dtype: str = "") -> Sample:
  """The build's settings, model, documents and chosen clusters first .. first +
  num_clusters - 1. model / dtype: decode with another model than the build's (load_model's
  names, random:SHAPE included), the documents fitted to its tokenizer."""
  from dpsynrag_jax.data.private_documents import fit_to_budget, load_private_documents  # pylint: disable=g-import-not-at-top
  from dpsynrag_jax.models import dtype_named, load_lm  # pylint: disable=g-import-not-at-top
  from dpsynrag_jax.synrag import workdir as wd_lib  # pylint: disable=g-import-not-at-top

  config = config_of_build(build_dir)
  selected = wd_lib.Workdir(build_dir).selected()
  if not selected:
    raise ValueError(f"{build_dir} holds no chosen clusters (private/selected.jsonl).")
  ids = [r for r in range(first, first + num_clusters) if r in selected]
  if len(ids) < num_clusters:
    raise ValueError(f"{build_dir} has {len(selected)} clusters; asked for {num_clusters}"
                     + (f" from cluster {first}." if first else "."))
  start = time.perf_counter()
  if model:
    lm = load_model(model, dtype_named(dtype or config.model.dtype))
  else:
    lm = load_lm(config.model.lm, dtype=dtype_named(config.model.dtype))
  documents, where = load_private_documents(config.data)
  documents = fit_to_budget(lm, documents, where, config.data.max_doc_tokens,
                            config.data.too_long)
  return Sample(config=config, lm=lm, documents=documents, selected=selected, ids=ids,
                seconds=time.perf_counter() - start)


# Fresh keys for re-decoding a sample: a benchmark re-releases nothing.
SAMPLE_KEY_SEED = 12345


def sample_key_of(r: int) -> jax.Array:
  return jax.random.fold_in(jax.random.PRNGKey(SAMPLE_KEY_SEED), r)
