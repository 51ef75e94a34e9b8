"""The decoder-only transformer: one Flax module for the Llama / Qwen2 / Mistral / Phi-3 / Gemma-2
family, switched by DecoderConfig.

Axis letters: B batch, S new tokens in this call, C cache slots, L layers, D model width,
N query heads, K key/value heads, G = N / K query heads per KV head, H head width, V vocabulary.

Every call extends a KV cache: it reads the cache (read-only, scanned per layer) and returns the
new tokens' keys [L, B, K, H, S] and values [L, B, K, S, H] (keys are stored transposed, see
kv_cache.py); the caller writes them in one update outside the layer scan. A full forward
without cache is the same call with C = 0. `decode_unrolled` is the one-token step of decode
loops on CPU: the same layers, unrolled, each writing its own cache buffer in place.
"""

from __future__ import annotations

import os

import flax.linen as nn
import jax
import jax.numpy as jnp

from dpsynrag_jax.models import rope
from dpsynrag_jax.models.config import DecoderConfig

_NEG_INF = -1e30  # finite, so a fully masked row gives a uniform softmax rather than NaN
# The one-token CPU decode computes attention for this many parts of the rows, each its own
# chain of elementwise kernels, which the thread pool runs side by side (one elementwise kernel
# runs on one core): one part per core, at most 8, since each part adds to the compile time
# (measured on 2 cores: 2 parts 7-15 % faster per step than 1, 4 parts no faster than 2). The
# parts do not change a row's arithmetic.
DECODE_ATTENTION_PARTS = min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                             else os.cpu_count() or 1)


class RMSNorm(nn.Module):
  eps: float
  plus_one: bool = False  # Gemma stores w and scales by (1 + w)

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    scale = self.param("scale", nn.initializers.zeros if self.plus_one else nn.initializers.ones,
                       (x.shape[-1],), jnp.float32)
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    w = scale.astype(jnp.float32)
    return (y * (1.0 + w if self.plus_one else w)).astype(x.dtype)


def _activation(name: str):
  if name == "silu":
    return jax.nn.silu
  return lambda x: jax.nn.gelu(x, approximate=(name == "gelu_tanh"))


def _softcap(x: jax.Array, cap: float) -> jax.Array:
  return jnp.tanh(x / cap) * cap if cap else x


def _pairwise_terms(terms: list[jax.Array]) -> jax.Array:
  """The terms added by halving: the first half plus the second, term by term, until one is
  left (an odd last term is carried to the next round), so the rounding error grows with log2
  of their number, not with it."""
  while len(terms) > 1:
    half = len(terms) // 2
    terms = [terms[i] + terms[half + i] for i in range(half)] + terms[2 * half:]
  return terms[0]


def _pairwise_sum(x: jax.Array, axis: int) -> jax.Array:
  """x summed over `axis` in _pairwise_terms' order, each round one fused elementwise add of
  the axis' two halves."""
  while x.shape[axis] > 1:
    n = x.shape[axis]
    half = n // 2
    part = lambda start, stop: jax.lax.slice_in_dim(x, start, stop, axis=axis)
    summed = part(0, half) + part(half, 2 * half)
    x = jnp.concatenate([summed, part(2 * half, n)], axis=axis) if n % 2 else summed
  return jnp.squeeze(x, axis)


def _fused_batched_matmul(a: jax.Array, b: jax.Array) -> jax.Array:
  """a [B, K, M, N] x b [B, K, N, P] -> [B, K, M, P] float32 without a dot (see Attention's
  one-token decode for why): the elementwise product [B, K, M, N, P] summed pairwise over N."""
  f32 = jnp.float32
  return _pairwise_sum(a.astype(f32)[..., None] * b[:, :, None].astype(f32), axis=3)


def _blocked_batched_matmul(a: jax.Array, b: jax.Array) -> jax.Array:
  """_fused_batched_matmul, the same sums in the same order, without materialising the product.

  With N = 2^r * m (m odd), the first r halvings pair slot j + m * t with slot j + m * t', so
  they are a pairwise sum of the 2^r blocks of m slots: one fused expression that reads b once
  and writes [B, K, M, m, P]; the m slots left are summed as _pairwise_terms. The product of
  the whole axis, halved round after round, wrote and read its halves each round: for the
  values of decode attention (N = C slots, P = H) this is 10-20 % of a decode step
  (BUILD_NOTES, "Decode attention without the materialised product"). Its expression has
  2^r + m terms where one term per slot would have N (a compile time of ~40 s instead of ~12
  for a SmolLM2 decode program at C = 208)."""
  f32 = jnp.float32
  a, b = a.astype(f32), b.astype(f32)
  n = b.shape[2]
  m = n
  while m % 2 == 0:
    m //= 2
  blocks = [a[:, :, :, t * m:(t + 1) * m, None] * b[:, :, None, t * m:(t + 1) * m]
            for t in range(n // m)]                                     # [B, K, M, m, P] each
  summed = _pairwise_terms(blocks)
  return _pairwise_terms([summed[:, :, :, j] for j in range(m)])




class Attention(nn.Module):
  """Grouped-query attention over [cache keys ; this call's keys]."""
  cfg: DecoderConfig
  dtype: jnp.dtype

  @nn.compact
  def __call__(self, x, cos, sin, positions, cache_k, cache_v, cache_positions, window,
               write_at=None, valid=None):
    """x [B, S, D]; positions [B, S]; cache_k [B, K, H, C]; cache_v [B, K, C, H];
    cache_positions [B, C]; window; valid None or [B, S] bool, False at padding positions.

    Padding positions' values are replaced by zeros with `where` before any product: their
    attention weights are exactly 0, but 0 * NaN is NaN, so garbage there (a NaN embedding
    of an out-of-range pad id, say) would otherwise reach every real position of the row.

    write_at None: the cache is read only; returns (out [B, S, D], k [B, K, H, S],
    v [B, K, S, H]), this call's keys and values.
    write_at = slot: this call's keys and values are first written into the cache at slots
    write_at .. write_at + S - 1 (cache_positions must already say so), then attention reads
    the cache alone; returns (out, cache_k, cache_v) updated. A caller holding one cache
    buffer per layer gets an in-place update and no copy (decode_unrolled).
    """
    cfg = self.cfg
    b, s, _ = x.shape
    dense = lambda n, bias, name: nn.Dense(n, use_bias=bias, dtype=self.dtype,
                                           param_dtype=self.dtype, name=name)
    q = dense(cfg.num_heads * cfg.head_dim, cfg.qkv_bias, "q_proj")(x)
    k = dense(cfg.num_kv_heads * cfg.head_dim, cfg.qkv_bias, "k_proj")(x)
    v = dense(cfg.num_kv_heads * cfg.head_dim, cfg.qkv_bias, "v_proj")(x)
    q = rope.apply_rotary(q.reshape(b, s, cfg.num_heads, cfg.head_dim), cos, sin)
    k = rope.apply_rotary(k.reshape(b, s, cfg.num_kv_heads, cfg.head_dim), cos, sin)
    v = v.reshape(b, s, cfg.num_kv_heads, cfg.head_dim)
    k, v = k.transpose(0, 2, 3, 1), v.transpose(0, 2, 1, 3)       # [B, K, H, S], [B, K, S, H]
    if valid is not None:
      v = jnp.where(valid[:, None, :, None], v, jnp.zeros((), v.dtype))

    if write_at is not None:
      zero = jnp.zeros((), jnp.int32)
      cache_k = jax.lax.dynamic_update_slice(cache_k, k.astype(cache_k.dtype),
                                             (zero, zero, zero, write_at))
      cache_v = jax.lax.dynamic_update_slice(cache_v, v.astype(cache_v.dtype),
                                             (zero, zero, write_at, zero))
      k, v = k[..., :0], v[..., :0, :]   # nothing new beyond the cache

    groups = cfg.num_heads // cfg.num_kv_heads
    # Queries of a KV head's G heads and S positions form one [G * S, H] block per (b, k): each
    # attention product is then a single batched matmul over (b, k) with no transposed copy of
    # the cache (measured 1.6x faster than a [G, S] layout for one-token decode on CPU).
    qg = q.reshape(b, s, cfg.num_kv_heads, groups, cfg.head_dim).transpose(0, 2, 3, 1, 4)
    qg = (qg * jnp.asarray(cfg.attention_scale, q.dtype)).reshape(
        b, cfg.num_kv_heads, groups * s, cfg.head_dim)                   # [B, K, G*S, H]
    # Masks come from positions, never slots: padded and empty slots hold position -1.
    q_pos = positions[:, None, None, :, None]                            # [B, 1, 1, S, 1]
    cache_pos = cache_positions[:, None, None, None, :]                  # [B, 1, 1, 1, C]
    new_pos = positions[:, None, None, None, :]                          # [B, 1, 1, 1, S]
    in_window = lambda kpos: jnp.logical_or(window <= 0, q_pos - kpos < window)
    cache_ok = (cache_pos >= 0) & (cache_pos <= q_pos) & in_window(cache_pos)
    new_ok = (new_pos <= q_pos) & in_window(new_pos)                     # causal in the call

    def attend(rows: slice, scores_product, values_product) -> jax.Array:
      """Attention of rows `rows` -> [b', K, G*S, H], with the two batched matmuls given."""
      n = len(range(*rows.indices(b)))
      split = lambda t: t.reshape(n, cfg.num_kv_heads, groups, s, t.shape[-1])
      merge = lambda t: t.reshape(n, cfg.num_kv_heads, groups * s, t.shape[-1])
      f32 = jnp.float32
      scores_cache = split(scores_product(qg[rows], cache_k[rows]))    # [b', K, G, S, C]
      scores_new = split(jnp.einsum("bkqh,bkht->bkqt", qg[rows], k[rows],
                                    preferred_element_type=f32))         # [b', K, G, S, S]
      cap = cfg.attn_logit_softcap
      scores = jnp.concatenate([
          jnp.where(cache_ok[rows], _softcap(scores_cache, cap), _NEG_INF),
          jnp.where(new_ok[rows], _softcap(scores_new, cap), _NEG_INF)], axis=-1)
      probs = jax.nn.softmax(scores, axis=-1).astype(self.dtype)
      c = cache_v.shape[2]
      attended = values_product(merge(probs[..., :c]), cache_v[rows]).astype(self.dtype)
      return attended + jnp.einsum("bkqt,bkth->bkqh", merge(probs[..., c:]), v[rows])

    if write_at is None:
      out = attend(slice(None),
                   lambda x, y: jnp.einsum("bkqh,bkhc->bkqc", x, y,
                                           preferred_element_type=jnp.float32),
                   lambda x, y: jnp.einsum("bkqc,bkch->bkqh", x, y))
    else:
      # One-token decode over per-layer caches (decode_unrolled, CPU): each (b, k) product is a
      # [G, H] x [H, C] matmul, which XLA:CPU runs as 3 * B tiny single-threaded calls (~8
      # GFLOP/s); _fused_batched_matmul's dot-free sums read the cache once. Each part of the
      # rows is its own chain of kernels, so that the thread pool runs them side by side (an
      # elementwise kernel runs on one core): BUILD_NOTES, "Decode attention as one fused tree".
      edges = [b * i // DECODE_ATTENTION_PARTS for i in range(DECODE_ATTENTION_PARTS + 1)]
      out = jnp.concatenate([attend(slice(lo, hi), _fused_batched_matmul, _blocked_batched_matmul)
                             for lo, hi in zip(edges, edges[1:]) if hi > lo])
    out = out.reshape(b, cfg.num_kv_heads, groups, s, cfg.head_dim).transpose(0, 3, 1, 2, 4)
    out = out.reshape(b, s, cfg.num_heads * cfg.head_dim)
    out = dense(cfg.hidden_size, cfg.o_bias, "o_proj")(out)
    return (out, cache_k, cache_v) if write_at is not None else (out, k, v)


class MLP(nn.Module):
  cfg: DecoderConfig
  dtype: jnp.dtype

  @nn.compact
  def __call__(self, x):
    cfg = self.cfg
    dense = lambda n, name: nn.Dense(n, use_bias=cfg.mlp_bias, dtype=self.dtype,
                                     param_dtype=self.dtype, name=name)
    hidden = _activation(cfg.activation)(dense(cfg.intermediate_size, "gate_proj")(x))
    return dense(cfg.hidden_size, "down_proj")(hidden * dense(cfg.intermediate_size, "up_proj")(x))


class DecoderLayer(nn.Module):
  """One pre-norm block; Gemma 2 adds norms after attention and MLP (sandwich)."""
  cfg: DecoderConfig
  dtype: jnp.dtype

  @nn.compact
  def __call__(self, x, scanned, cos, sin, positions, cache_positions, write_at=None,
               valid=None):
    """Returns (x, (k, v)): this call's keys and values, or the updated cache with write_at
    (see Attention)."""
    cache_k, cache_v, window = scanned
    cfg = self.cfg
    norm = lambda name: RMSNorm(cfg.rms_norm_eps, cfg.norm_plus_one, name=name)
    h, k, v = Attention(cfg, self.dtype, name="attn")(
        norm("input_norm")(x), cos, sin, positions, cache_k, cache_v, cache_positions, window,
        write_at, valid)
    if cfg.sandwich_norms:
      h = norm("post_attn_norm")(h)
    x = x + h
    h = MLP(cfg, self.dtype, name="mlp")(norm("pre_mlp_norm")(x))
    if cfg.sandwich_norms:
      h = norm("post_mlp_norm")(h)
    return x + h, (k, v)


def _embed_tokens(cfg: DecoderConfig, dtype, embedding: jax.Array, tokens: jax.Array):
  """Token ids [B, S] -> embeddings [B, S, D] (Gemma scales them by sqrt(D))."""
  x = jnp.take(embedding.astype(dtype), tokens, axis=0)
  if cfg.embed_scale:
    x = x * jnp.asarray(cfg.hidden_size ** 0.5, dtype)
  return x


def _output_logits(cfg: DecoderConfig, dtype, x: jax.Array, head: jax.Array) -> jax.Array:
  """Final hidden states [..., D] and the head [D, V] -> logits [..., V] float32."""
  logits = jnp.einsum("...d,dv->...v", x, head.astype(dtype), preferred_element_type=jnp.float32)
  return _softcap(logits, cfg.final_logit_softcap)


class Decoder(nn.Module):
  """Token ids -> logits, extending a KV cache.

  Layers are one nn.scan over stacked parameters: one compiled layer whatever the depth. On
  CPU the one-token decode step inside a while loop runs `decode_unrolled` instead (same
  parameters; see there why).
  """
  cfg: DecoderConfig
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, tokens, cache_k, cache_v, cache_positions, lengths, logits_index=None,
               new_lengths=None):
    """Runs S new tokens per row after each row's cached tokens.

    Args:
      tokens: [B, S] int32; row b's valid new tokens are its first ones (right padding).
      cache_k: [L, B, K, H, C], cache_v: [L, B, K, C, H]; C may be 0 (no cache).
      cache_positions: [B, C] int32 position held by each cache slot, -1 when empty.
      lengths: [B] int32, tokens already in the cache per row (the first new token's position).
      logits_index: None for logits at every new position, or [B] int32 picking one position.
      new_lengths: None (every new token real) or [B] int32, row b's real new tokens; the rest
        is padding, whose values never reach a real position (see Attention).

    Returns:
      (logits [B, S, V] or [B, V] float32, new_k [L, B, K, H, S], new_v [L, B, K, S, H]).
    """
    cfg = self.cfg
    embed = nn.Embed(cfg.vocab_size, cfg.hidden_size, dtype=self.dtype,
                     param_dtype=self.dtype, name="embed")
    x = _embed_tokens(cfg, self.dtype, embed.embedding, tokens)
    positions = lengths[:, None] + jnp.arange(tokens.shape[1])[None, :]
    cos, sin = rope.cos_sin(cfg, positions)

    valid = (None if new_lengths is None else
             jnp.arange(tokens.shape[1])[None, :] < new_lengths[:, None])
    layers = nn.scan(
        DecoderLayer,
        variable_axes={"params": 0},
        split_rngs={"params": True},
        in_axes=(0, nn.broadcast, nn.broadcast, nn.broadcast, nn.broadcast, nn.broadcast,
                 nn.broadcast),
        length=cfg.num_layers)(cfg, self.dtype, name="layers")
    windows = jnp.asarray(cfg.layer_windows, jnp.int32)
    x, (new_k, new_v) = layers(x, (cache_k, cache_v, windows), cos, sin, positions,
                               cache_positions, None, valid)

    x = RMSNorm(cfg.rms_norm_eps, cfg.norm_plus_one, name="final_norm")(x)
    if logits_index is not None:
      x = jnp.take_along_axis(x, logits_index[:, None, None], axis=1)[:, 0]
    if cfg.tie_word_embeddings:
      head = embed.embedding.T
    else:
      head = self.param("lm_head", nn.initializers.lecun_normal(),
                        (cfg.hidden_size, cfg.vocab_size), self.dtype)
    return _output_logits(cfg, self.dtype, x, head), new_k, new_v


def split_layers(params):
  """The stacked layer parameters as a tuple of per-layer trees (for decode_unrolled)."""
  stacked = params["layers"]
  num_layers = jax.tree.leaves(stacked)[0].shape[0]
  return tuple(jax.tree.map(lambda a, i=i: a[i], stacked) for i in range(num_layers))


def decode_unrolled(params, layer_params, cfg: DecoderConfig, dtype, layer_k, layer_v,
                    cache_positions, lengths, cursor, tokens):
  """One new token per row with the layers unrolled over per-layer cache buffers.

  Why: inside the decode while loop, a layer scan slices each layer's weights and cache out of
  the stacked arrays, and on CPU every slice is a copy (profiled on a 64-row SmolLM2 step: ~20 %
  of the step copying ~1 GB). Here each layer's weights are sliced once, before the loop
  (`split_layers`), and each layer's cache is its own buffer, written in place at `cursor`
  before attention reads it. Same parameters and arithmetic as Decoder.

  Args:
    params: the model's parameters (embedding, final norm, head); layer_params: split_layers.
    layer_k: per layer [B, K, H, C]; layer_v: per layer [B, K, C, H].
    cache_positions: [B, C] int32 position held by each slot (-1 empty), before this token.
    lengths: [B] int32, the new token's position per row; cursor: [] int32 slot it goes to.
    tokens: [B] int32.

  Returns:
    (logits [B, V] float32, layer_k, layer_v, cache_positions) with the token written.
  """
  x = _embed_tokens(cfg, dtype, params["embed"]["embedding"], tokens[:, None])
  positions = lengths[:, None]                                          # [B, 1]
  cos, sin = rope.cos_sin(cfg, positions)
  cache_positions = jax.lax.dynamic_update_slice(
      cache_positions, positions.astype(jnp.int32), (jnp.zeros((), jnp.int32), cursor))
  layer = DecoderLayer(cfg, dtype)
  new_k, new_v = [], []
  for lp, k, v, window in zip(layer_params, layer_k, layer_v, cfg.layer_windows):
    x, (k, v) = layer.apply({"params": lp}, x, (k, v, jnp.int32(window)), cos, sin, positions,
                            cache_positions, write_at=cursor)
    new_k.append(k)
    new_v.append(v)
  x = RMSNorm(cfg.rms_norm_eps, cfg.norm_plus_one).apply({"params": params["final_norm"]}, x)
  head = (params["embed"]["embedding"].T if cfg.tie_word_embeddings else params["lm_head"])
  return (_output_logits(cfg, dtype, x[:, 0], head), tuple(new_k), tuple(new_v),
          cache_positions)
