"""The decoder-only transformer: one Flax module for the Llama / Qwen2 / Mistral / Phi-3 / Gemma-2
family, switched by DecoderConfig.

Axis letters: B batch, S new tokens in this call, C cache slots, L layers, D model width,
N query heads, K key/value heads, G = N / K query heads per KV head, H head width, V vocabulary.

Every call extends a KV cache: it reads the cache (read-only, scanned per layer) and returns the
new tokens' keys [L, B, K, H, S] and values [L, B, K, S, H] (keys are stored transposed, see
kv_cache.py); the caller writes them in one update outside the layer scan. A full forward
without cache is the same call with C = 0. `decode_unrolled` is the one-token step of decode
loops on CPU: the same layers, unrolled, each writing its own cache buffer in place; on CPU the
parameters are held per layer (`unstack_params`) and every call runs unrolled
(`forward_unrolled`), so no program copies the weights out of a stack.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from dpsynrag_jax.models import rope
from dpsynrag_jax.models.config import DecoderConfig

_NEG_INF = -1e30  # finite, so a fully masked row gives a uniform softmax rather than NaN


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


def _pairwise_sum(x: jax.Array, axis: int) -> jax.Array:
  """x summed over `axis` by halving: the first half plus the second, until one slice is left
  (an odd slice is carried to the next round). Each round is one fused elementwise add that XLA
  spreads over the cores, and the rounding error grows with log2 of the axis, not its length."""
  while x.shape[axis] > 1:
    n = x.shape[axis]
    half = n // 2
    part = lambda start, stop: jax.lax.slice_in_dim(x, start, stop, axis=axis)
    summed = part(0, half) + part(half, 2 * half)
    x = jnp.concatenate([summed, part(2 * half, n)], axis=axis) if n % 2 else summed
  return jnp.squeeze(x, axis)


def _fused_batched_matmul(a: jax.Array, b: jax.Array) -> jax.Array:
  """a [B, K, M, N] x b [B, K, N, P] -> [B, K, M, P] float32, as one elementwise product summed
  pairwise over N (see Attention's one-token decode for why not a dot)."""
  f32 = jnp.float32
  return _pairwise_sum(a.astype(f32)[..., None] * b[:, :, None].astype(f32), axis=3)


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
    f32 = jnp.float32
    if write_at is not None:
      # One-token decode over per-layer caches (decode_unrolled, CPU): each (b, k) product is a
      # [G, H] x [H, C] matmul, which XLA:CPU runs as 3 * B tiny single-threaded calls (~8
      # GFLOP/s). The same sums as one fused elementwise product halved pairwise read the cache
      # once, on every core: 2.2-4x faster per layer (BUILD_NOTES, "Whole-build benchmark").
      scores_cache = _fused_batched_matmul(qg, cache_k)                  # [B, K, G*S, C]
    else:
      scores_cache = jnp.einsum("bkqh,bkhc->bkqc", qg, cache_k, preferred_element_type=f32)
    scores_new = jnp.einsum("bkqh,bkht->bkqt", qg, k, preferred_element_type=f32)
    split = lambda t: t.reshape(b, cfg.num_kv_heads, groups, s, t.shape[-1])
    scores_cache, scores_new = split(scores_cache), split(scores_new)  # [B, K, G, S, C|S]

    # Masks come from positions, never slots: padded and empty slots hold position -1.
    q_pos = positions[:, None, None, :, None]                            # [B, 1, 1, S, 1]
    cache_pos = cache_positions[:, None, None, None, :]                  # [B, 1, 1, 1, C]
    new_pos = positions[:, None, None, None, :]                          # [B, 1, 1, 1, S]
    in_window = lambda kpos: jnp.logical_or(window <= 0, q_pos - kpos < window)
    cache_ok = (cache_pos >= 0) & (cache_pos <= q_pos) & in_window(cache_pos)
    new_ok = (new_pos <= q_pos) & in_window(new_pos)                     # causal in the call

    cap = cfg.attn_logit_softcap
    scores = jnp.concatenate([
        jnp.where(cache_ok, _softcap(scores_cache, cap), _NEG_INF),
        jnp.where(new_ok, _softcap(scores_new, cap), _NEG_INF)], axis=-1)
    probs = jax.nn.softmax(scores, axis=-1).astype(self.dtype)
    c = cache_v.shape[2]
    merge = lambda t: t.reshape(b, cfg.num_kv_heads, groups * s, t.shape[-1])
    # The values product stays a dot in the one-token decode too: fused and halved pairwise
    # over C (208 = 16 * 13 slots), XLA:CPU splits the tree into fusions that compute the
    # product twice; as a dot the whole SmolLM2 step is 12 % faster at 64 rows and 25 % at 128
    # (BUILD_NOTES, "Decode attention's values product as a dot").
    attended = jnp.einsum("bkqc,bkch->bkqh", merge(probs[..., :c]), cache_v)
    out = (attended +
           jnp.einsum("bkqt,bkth->bkqh", merge(probs[..., c:]), v))      # [B, K, G*S, H]
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


def _new_positions(cfg: DecoderConfig, tokens, lengths, new_lengths):
  """(positions [B, S], rope (cos, sin), valid [B, S] bool or None) of S new tokens per row."""
  positions = lengths[:, None] + jnp.arange(tokens.shape[1])[None, :]
  valid = (None if new_lengths is None else
           jnp.arange(tokens.shape[1])[None, :] < new_lengths[:, None])
  return positions, rope.cos_sin(cfg, positions), valid


def _pick(x, logits_index):
  """Hidden states [B, S, D] -> [B, D] at logits_index [B], or unchanged when it is None."""
  if logits_index is None:
    return x
  return jnp.take_along_axis(x, logits_index[:, None, None], axis=1)[:, 0]


class Decoder(nn.Module):
  """Token ids -> logits, extending a KV cache.

  Layers are one nn.scan over stacked parameters: one compiled layer whatever the depth. On
  CPU, models hold their parameters per layer (unstack_params) and run `forward_unrolled` and,
  inside decode loops, `decode_unrolled` instead (the same layers; see there why).
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
    positions, (cos, sin), valid = _new_positions(cfg, tokens, lengths, new_lengths)
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

    x = _pick(RMSNorm(cfg.rms_norm_eps, cfg.norm_plus_one, name="final_norm")(x), logits_index)
    if cfg.tie_word_embeddings:
      head = embed.embedding.T
    else:
      head = self.param("lm_head", nn.initializers.lecun_normal(),
                        (cfg.hidden_size, cfg.vocab_size), self.dtype)
    return _output_logits(cfg, self.dtype, x, head), new_k, new_v


def per_layer(params) -> bool:
  """Whether params hold their layers per layer (unstack_params) rather than stacked."""
  return isinstance(params["layers"], tuple)


def split_layers(params):
  """The layer parameters as a tuple of per-layer trees (for the unrolled calls below)."""
  if per_layer(params):
    return params["layers"]
  stacked = params["layers"]
  num_layers = jax.tree.leaves(stacked)[0].shape[0]
  return tuple(jax.tree.map(lambda a, i=i: a[i], stacked) for i in range(num_layers))


def unstack_params(params):
  """params with params["layers"] a tuple of per-layer trees, each its own buffer.

  Why: the unrolled calls read one layer's weights at a time; from stacked weights, a program
  slices them first, and on CPU every slice is a copy: a second copy of the layer weights
  (0.43 GB for SmolLM2-135M in fp32) alive while any decode program runs, which is what the
  whole paper_cpu build's peak resident size was made of (BUILD_NOTES, "Weights held per
  layer"). Unstacked once at load, no program copies them. Idempotent."""
  if per_layer(params):
    return params
  return {**params, "layers": split_layers(params)}


def _final_norm(params, cfg: DecoderConfig, x):
  return RMSNorm(cfg.rms_norm_eps, cfg.norm_plus_one).apply({"params": params["final_norm"]}, x)


def _head_logits(params, cfg: DecoderConfig, dtype, x):
  """Normed hidden states [..., D] -> logits [..., V] float32 (tied or own head)."""
  head = (params["embed"]["embedding"].T if cfg.tie_word_embeddings else params["lm_head"])
  return _output_logits(cfg, dtype, x, head)


def forward_unrolled(params, cfg: DecoderConfig, dtype, tokens, cache_k, cache_v,
                     cache_positions, lengths, logits_index=None, new_lengths=None):
  """Decoder's call (same arguments and results) over per-layer parameters (unstack_params):
  the layers unrolled, each applying DecoderLayer with its own weights, in place of the layer
  scan over stacked ones. Same arithmetic, layer by layer, as Decoder."""
  x = _embed_tokens(cfg, dtype, params["embed"]["embedding"], tokens)
  positions, (cos, sin), valid = _new_positions(cfg, tokens, lengths, new_lengths)
  layer = DecoderLayer(cfg, dtype)
  new_k, new_v = [], []
  for i, (lp, window) in enumerate(zip(params["layers"], cfg.layer_windows)):
    x, (k, v) = layer.apply({"params": lp}, x, (cache_k[i], cache_v[i], jnp.int32(window)), cos,
                            sin, positions, cache_positions, None, valid)
    new_k.append(k)
    new_v.append(v)
  x = _pick(_final_norm(params, cfg, x), logits_index)
  return _head_logits(params, cfg, dtype, x), jnp.stack(new_k), jnp.stack(new_v)


def decode_unrolled(params, layer_params, cfg: DecoderConfig, dtype, layer_k, layer_v,
                    cache_positions, lengths, cursor, tokens):
  """One new token per row with the layers unrolled over per-layer cache buffers.

  Why: inside the decode while loop, a layer scan slices each layer's weights and cache out of
  the stacked arrays, and on CPU every slice is a copy (profiled on a 64-row SmolLM2 step: ~20 %
  of the step copying ~1 GB). Here each layer's weights are sliced once, before the loop
  (`split_layers`; none where they are held per layer, unstack_params), and each layer's
  cache is its own buffer, written in place at `cursor`
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
  x = _final_norm(params, cfg, x)
  return (_head_logits(params, cfg, dtype, x[:, 0]), tuple(new_k), tuple(new_v),
          cache_positions)
