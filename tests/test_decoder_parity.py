"""Our Flax decoder against transformers (PyTorch) on tiny random checkpoints of each family."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from dpsynrag_jax.models import load_lm
from dpsynrag_jax.models import decoder
from dpsynrag_jax.models import inference
from dpsynrag_jax.models import kv_cache
from dpsynrag_jax.models import language_model

_COMMON = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=211, max_position_embeddings=256)

# Each entry exercises what is special about the family.
ARCHITECTURES = {
    "llama3_rope_biases": (transformers.LlamaConfig, transformers.LlamaForCausalLM, dict(
        attention_bias=True, mlp_bias=True, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 16})),
    "qwen2_qkv_bias_tied": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, dict(
        tie_word_embeddings=True)),
    "mistral_sliding_window": (transformers.MistralConfig, transformers.MistralForCausalLM, dict(
        sliding_window=5)),
    "phi3_fused_partial_longrope": (transformers.Phi3Config, transformers.Phi3ForCausalLM, dict(
        partial_rotary_factor=0.75, original_max_position_embeddings=32,
        rope_scaling={"type": "longrope", "short_factor": [1.0, 1.1, 1.3, 1.7, 2.0, 2.5],
                      "long_factor": [1.5, 2.0, 3.0, 4.0, 6.0, 8.0]},
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    "gemma2_softcap_sandwich_window": (transformers.Gemma2Config, transformers.Gemma2ForCausalLM,
                                       dict(head_dim=16, query_pre_attn_scalar=24,
                                            sliding_window=4, attn_logit_softcapping=5.0,
                                            final_logit_softcapping=3.0)),
}


def _save_tiny(arch: str, folder, seed=0, dtype=torch.float32, **save_kwargs):
  config_cls, model_cls, extra = ARCHITECTURES[arch]
  torch.manual_seed(seed)
  config = config_cls(**{**_COMMON, **extra})
  if arch.startswith("gemma2"):
    config._attn_implementation = "eager"  # soft-capping needs the eager path
  model = model_cls(config).eval()
  # Random init leaves norms at 1 (or 0 for Gemma): perturb them so norm handling is tested.
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name:
        p.add_(0.1 * torch.randn_like(p))
  model = model.to(dtype)
  model.save_pretrained(folder, **save_kwargs)
  return model


@functools.partial(jax.jit, static_argnames=("cfg", "dtype"))
def _one_token(params, cfg, dtype, cache, tokens):
  """tokens [B] after the cache -> (logits [B, V], cache): inference.extend with one new token
  per row, the step the layer-scan decode loop runs."""
  return inference.extend(params, cfg, dtype, cache, tokens[:, None],
                          jnp.ones(tokens.shape, jnp.int32))


def _decode_step(lm, tokens, cache):
  return _one_token(lm.params, lm.config, lm.dtype, cache, jnp.asarray(tokens, jnp.int32))


def _ids(rng, batch, length, vocab=211):
  return rng.integers(3, vocab, size=(batch, length)).astype(np.int32)


def _torch_logits(model, ids):
  with torch.no_grad():
    return model(torch.tensor(ids, dtype=torch.long)).logits.float().numpy()


@pytest.fixture(scope="module", params=sorted(ARCHITECTURES))
def tiny(request, tmp_path_factory):
  folder = tmp_path_factory.mktemp(request.param)
  model = _save_tiny(request.param, folder)
  return request.param, model, load_lm(str(folder))


def test_full_forward_matches_transformers(tiny):
  arch, model, lm = tiny
  # 20 tokens stay inside Phi-3's original context (short factors), 40 pass it (long factors).
  for length in (20, 40):
    ids = _ids(np.random.default_rng(length), 2, length)
    diff = np.abs(lm.logits(ids) - _torch_logits(model, ids)).max()
    print(f"{arch} length {length}: max |logits diff| = {diff:.2e}")
    assert diff <= 1e-4, f"{arch}: max |logits diff| = {diff}"


def test_prefill_then_decode_equals_full_forward(tiny):
  arch, _, lm = tiny
  rng = np.random.default_rng(2)
  # Rows of different prompt lengths share the batch: each row's cache stays contiguous.
  prompts = [_ids(rng, 1, n)[0].tolist() for n in (7, 11, 4)]
  continuation = _ids(rng, 3, 6)
  logits, cache = lm.prefill(prompts, capacity=32)
  for row, p in enumerate(prompts):
    full = lm.logits([p])[0, -1]
    np.testing.assert_allclose(np.asarray(logits[row]), full, atol=1e-4, err_msg=arch)
  for step in range(continuation.shape[1]):
    tokens = np.zeros((cache.batch_size,), np.int32)
    tokens[:3] = continuation[:, step]
    logits, cache = _decode_step(lm, tokens, cache)
    for row, p in enumerate(prompts):
      seq = p + continuation[row, :step + 1].tolist()
      full = lm.logits([seq])[0, -1]
      np.testing.assert_allclose(np.asarray(logits[row]), full, atol=1e-4,
                                 err_msg=f"{arch} step {step} row {row}")


def test_chunked_prefill_equals_one_call(tiny, monkeypatch):
  """Long prompts are prefilled chunk by chunk (memory). Rows ending in different chunks, one
  inside the first, get the one-call prefill's next-token logits, and decoding from either cache
  gives the same logits (LongRoPE keeps one call past its original length: see prefill)."""
  arch, _, lm = tiny
  rng = np.random.default_rng(5)
  prompts = [_ids(rng, 1, n)[0].tolist() for n in (7, 40, 20, 33)]   # bucket 48: 3 chunks
  continuation = _ids(rng, 4, 3)

  def run(chunk_from):
    monkeypatch.setattr(language_model, "CHUNKED_PREFILL_FROM", chunk_from)
    monkeypatch.setattr(language_model, "PREFILL_CHUNK", 16)
    logits, cache = lm.prefill(prompts, capacity=64)
    steps = [np.asarray(logits[:4])]
    for step in range(continuation.shape[1]):
      tokens = np.zeros((cache.batch_size,), np.int32)
      tokens[:4] = continuation[:, step]
      logits, cache = _decode_step(lm, tokens, cache)
      steps.append(np.asarray(logits[:4]))
    return steps

  for step, (one, chunked) in enumerate(zip(run(4096), run(16))):
    np.testing.assert_allclose(chunked, one, atol=1e-4, err_msg=f"{arch} step {step}")


def test_a_callers_prefill_chunk_equals_one_call(tiny):
  """prefill(chunk=n) chunks prompts shorter than the default threshold (a caller bounding its
  memory): the same next-token logits up to summation order; a chunk that is not positive is
  refused."""
  arch, _, lm = tiny
  rng = np.random.default_rng(6)
  prompts = [_ids(rng, 1, n)[0].tolist() for n in (9, 45, 30, 17)]   # bucket 48: 3 chunks of 16
  one, _ = lm.prefill(prompts, capacity=64)
  chunked, _ = lm.prefill(prompts, capacity=64, chunk=16)
  np.testing.assert_allclose(np.asarray(chunked[:4]), np.asarray(one[:4]), atol=1e-4,
                             err_msg=arch)
  with pytest.raises(ValueError, match="chunk"):
    lm.prefill(prompts, capacity=64, chunk=0)


def _stacked(params):
  """Per-layer parameters (decoder.unstack_params) stacked back, as the layer scan wants them."""
  return {**params, "layers": jax.tree.map(lambda *a: jnp.stack(a), *params["layers"])}


def test_cpu_models_hold_their_weights_per_layer_once(tiny):
  """On CPU a loaded model holds each layer's weights as its own buffer (no program copies them
  out of a stack), the same values as the stacked checkpoint, and unstacking is idempotent."""
  arch, _, lm = tiny
  assert jax.default_backend() == "cpu"
  assert decoder.per_layer(lm.params)
  assert len(lm.params["layers"]) == lm.config.num_layers
  assert decoder.unstack_params(lm.params) is lm.params
  again = decoder.unstack_params(_stacked(lm.params))
  for one, other in zip(jax.tree.leaves(lm.params), jax.tree.leaves(again)):
    np.testing.assert_array_equal(one, other, err_msg=arch)


# Families whose unrolled forward is the layer scan's bit for bit: no biases, no Gemma-2 parts
# (the demo's SmolLM2 is a bias-free Llama). With biases, or Gemma-2's, XLA:CPU fuses the
# unrolled layers' adds otherwise than the scan's body: the last bits move (<= 3e-7 here).
_UNROLLED_BIT_EXACT = ("mistral_sliding_window", "phi3_fused_partial_longrope")


def test_unrolled_forward_equals_the_layer_scan(tiny):
  """forward_unrolled over per-layer weights and the Decoder's layer scan over stacked ones: the
  full forward of padded rows, and a prefill's logits and cache (sliding windows, soft-caps,
  biases and LongRoPE of every family included), bit for bit where _UNROLLED_BIT_EXACT says so,
  else within float32 rounding."""
  arch, _, lm = tiny
  same = (np.testing.assert_array_equal if arch in _UNROLLED_BIT_EXACT else
          functools.partial(np.testing.assert_allclose, rtol=0, atol=1e-6))
  rng = np.random.default_rng(7)
  tokens = jnp.asarray(_ids(rng, 3, 9))
  lengths = jnp.asarray([9, 5, 2], jnp.int32)
  stacked = _stacked(lm.params)
  assert decoder.per_layer(lm.params) and not decoder.per_layer(stacked)
  same(inference.full_logits(lm.params, lm.config, lm.dtype, tokens, lengths),
       inference.full_logits(stacked, lm.config, lm.dtype, tokens, lengths), err_msg=arch)
  prefilled = [inference.prefill(params, lm.config, lm.dtype,
                                 kv_cache.init_cache(lm.config, 3, 16, lm.dtype), tokens, lengths)
               for params in (lm.params, stacked)]
  for one, other in zip(jax.tree.leaves(prefilled[0]), jax.tree.leaves(prefilled[1])):
    same(one, other, err_msg=arch)


def test_unrolled_decode_loop_equals_full_forward(tiny):
  """The decode loop with unrolled layers and per-layer caches (the CPU default) and with the
  layer scan choose the same greedy tokens, and those are the full forward's argmax at every
  step, for rows of different prompt lengths (sliding windows included: 6 steps pass them)."""
  arch, _, lm = tiny
  rng = np.random.default_rng(4)
  prompts = [_ids(rng, 1, n)[0].tolist() for n in (7, 11, 4)]
  logits, cache = lm.prefill(prompts, capacity=32)
  run = jax.jit(inference.run_decode_loop, static_argnames=(
      "cfg", "dtype", "max_new_tokens", "select", "eos_ids", "pad_id", "unrolled"))
  # The scan runs over stacked weights: per-layer ones would run the scan path unrolled too.
  params = {True: lm.params, False: _stacked(lm.params)}
  outs = {unrolled: np.asarray(run(params[unrolled], lm.config, lm.dtype, cache, logits,
                                   jax.random.PRNGKey(0), max_new_tokens=6,
                                   select=inference.Sampler(), eos_ids=(-1,), pad_id=0,
                                   unrolled=unrolled)[0])
          for unrolled in (True, False)}
  np.testing.assert_array_equal(outs[True], outs[False], err_msg=arch)
  for row, p in enumerate(prompts):
    full = lm.logits([p + outs[True][row, :5].tolist()])[0]
    np.testing.assert_array_equal(np.argmax(full[len(p) - 1:], axis=-1), outs[True][row],
                                  err_msg=f"{arch} row {row}")


def test_garbage_in_padding_never_reaches_a_real_row(tiny):
  """The pad token's embedding filled with NaN: every padded position and padded row carries
  NaN, and the real rows' logits (full forward, prefill, decode) are finite and unchanged."""
  arch, _, lm = tiny
  rng = np.random.default_rng(9)
  prompts = [_ids(rng, 1, n)[0].tolist() for n in (7, 11, 4)]
  continuation = _ids(rng, 3, 4)
  poisoned = type(lm)(lm.config, jax.tree.map(lambda a: a, lm.params), lm.tokenizer, lm.dtype,
                      lm.eos_ids, source="poisoned")
  poisoned.pad_id = 1
  embed = np.asarray(poisoned.params["embed"]["embedding"]).copy()
  embed[poisoned.pad_id] = np.nan
  poisoned.params = {**poisoned.params, "embed": {"embedding": jax.numpy.asarray(embed)}}
  clean = type(lm)(lm.config, lm.params, lm.tokenizer, lm.dtype, lm.eos_ids, source="clean")
  clean.pad_id = 1
  for model in (clean, poisoned):   # real tokens never use the pad id (ids start at 3)
    assert all(t != model.pad_id for p in prompts for t in p)

  def run(model):
    out = [model.logits([p])[0] for p in prompts]        # padded to the length bucket
    logits, cache = model.prefill(prompts, capacity=32)  # rows of 3 lengths, batch padded to 8
    out.append(np.asarray(logits[:3]))
    for step in range(continuation.shape[1]):
      tokens = np.full((cache.batch_size,), model.pad_id, np.int32)
      tokens[:3] = continuation[:, step]
      logits, cache = _decode_step(model, tokens, cache)
      out.append(np.asarray(logits[:3]))
    return out

  # A tied head reads the poisoned row as the pad token's own logit column: leave it out.
  keep = np.arange(lm.config.vocab_size) != (clean.pad_id if lm.config.tie_word_embeddings
                                              else -1)
  for a, b in zip(run(clean), run(poisoned)):
    assert np.all(np.isfinite(b[..., keep])), arch
    np.testing.assert_allclose(a[..., keep], b[..., keep], atol=1e-5, err_msg=arch)


@pytest.mark.parametrize("arch", ["llama3_rope_biases", "gemma2_softcap_sandwich_window"])
def test_sharded_checkpoint_round_trip(arch, tmp_path):
  """save_pretrained with small shards (index json) loads to the same logits as one file."""
  model = _save_tiny(arch, tmp_path / "one", seed=3)
  model.save_pretrained(tmp_path / "sharded", max_shard_size="40KB")
  assert (tmp_path / "sharded" / "model.safetensors.index.json").exists()
  ids = _ids(np.random.default_rng(4), 1, 9)
  a = load_lm(str(tmp_path / "one")).logits(ids)
  b = load_lm(str(tmp_path / "sharded")).logits(ids)
  np.testing.assert_array_equal(a, b)


def test_bf16_checkpoint_loads_in_bf16(tmp_path):
  import jax.numpy as jnp
  model = _save_tiny("llama3_rope_biases", tmp_path, seed=5, dtype=torch.bfloat16)
  lm = load_lm(str(tmp_path), dtype=jnp.bfloat16)
  assert lm.params["embed"]["embedding"].dtype == jnp.bfloat16
  ids = _ids(np.random.default_rng(6), 1, 12)
  ref = _torch_logits(model.float(), ids)
  # bf16 compute against an fp32 reference of the same bf16 weights: loose, but catches layout.
  diff = np.abs(lm.logits(ids) - ref).max()
  assert diff < 0.1 * np.abs(ref).max()


def test_prompts_inside_one_bucket_compile_once(tmp_path):
  _save_tiny("llama3_rope_biases", tmp_path, seed=8)
  lm = load_lm(str(tmp_path))
  rng = np.random.default_rng(7)
  before = inference.TRACE_COUNTS["prefill"]
  # Lengths 17, 23, 30 share the 32 bucket; capacity 80 is used by no other test, so the first
  # call compiles exactly once and the others reuse it.
  for n in (17, 23, 30):
    lm.prefill([_ids(rng, 1, n)[0].tolist()], capacity=80)
  assert inference.TRACE_COUNTS["prefill"] - before == 1
  lm.prefill([_ids(rng, 1, 20)[0].tolist()] * 3, capacity=80)  # batch 3 pads to the same 8
  assert inference.TRACE_COUNTS["prefill"] - before == 1
  lm.prefill([_ids(rng, 1, 40)[0].tolist()], capacity=80)  # next bucket: one more compile
  assert inference.TRACE_COUNTS["prefill"] - before == 2


@pytest.mark.parametrize("n", [1, 2, 3, 7, 8, 13, 64])
def test_pairwise_sum_adds_every_slice_once(n):
  """The halving sum of decode attention (odd slices carried over) counts each slice exactly
  once: integer-valued floats sum exactly, random ones to fp32 rounding."""
  from dpsynrag_jax.models import decoder
  weights = np.arange(1, n + 1, dtype=np.float32) ** 2         # distinct per slice
  x = np.broadcast_to(weights[None, :, None], (3, n, 4))
  np.testing.assert_array_equal(np.asarray(decoder._pairwise_sum(jnp.asarray(x), axis=1)),
                                x.sum(axis=1))
  y = np.random.default_rng(n).normal(size=(2, 5, n)).astype(np.float32)
  np.testing.assert_allclose(np.asarray(decoder._pairwise_sum(jnp.asarray(y), axis=2)),
                             y.astype(np.float64).sum(axis=2), rtol=1e-5, atol=1e-5)
