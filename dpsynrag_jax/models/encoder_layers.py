"""The transformer of a sentence encoder (BERT or MPNet), in Flax, and its pooling.

Both architectures are post-LayerNorm encoders with the same layer; they differ only in how
positions enter:
  - BERT adds absolute position and token-type embeddings to the word embeddings.
  - MPNet adds absolute position embeddings whose ids start at padding_idx + 1 (as RoBERTa), has
    no token types, and adds to every layer's attention logits one relative position bias table,
    indexed by a log-spaced bucket of the distance and shared by all layers (T5-style).

Axis letters: B batch, S sequence, D width, H heads, K head width.
Weights are held in `dtype` and the matmuls run in it; LayerNorm, softmax and pooling run in
float32 so bf16 weights cost little accuracy.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

# Added to the attention logits of padded keys. Finite, so that a row with no real key at all
# (the padded rows of a batch) gives a uniform softmax instead of NaN.
_MASKED_LOGIT = -1e9

ACTIVATIONS = {
    "gelu": functools.partial(jax.nn.gelu, approximate=False),  # HF "gelu" is the erf form
    "gelu_new": functools.partial(jax.nn.gelu, approximate=True),
    "gelu_pytorch_tanh": functools.partial(jax.nn.gelu, approximate=True),
    "relu": jax.nn.relu,
    "silu": jax.nn.silu,
    "swish": jax.nn.silu,
}

POOLING_MODES = ("cls", "mean", "max", "lasttoken")


@dataclasses.dataclass(frozen=True)
class EncoderConfig:
  """What the encoder's shapes and position scheme depend on (read from HF config.json)."""
  model_type: str               # "bert" or "mpnet"
  vocab_size: int
  hidden_size: int              # D
  num_layers: int
  num_heads: int                # H
  intermediate_size: int
  max_position_embeddings: int  # rows of the absolute position table
  layer_norm_eps: float
  hidden_act: str
  pad_token_id: int
  type_vocab_size: int = 0      # BERT token types; 0 means none (MPNet)
  position_offset: int = 0      # id of the first real token's position (MPNet: padding_idx + 1)
  relative_buckets: int = 0     # MPNet's relative bias buckets; 0 means no relative bias
  relative_max_distance: int = 128

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  @property
  def max_positions(self) -> int:
    """The longest sequence the absolute position table can index."""
    return self.max_position_embeddings - self.position_offset


def relative_position_buckets(length: int, num_buckets: int, max_distance: int) -> np.ndarray:
  """MPNet's bucket of every (query, key) distance: [S, S] int32, computed on the host.

  Half the buckets are for keys before the query, half for keys after; within a half, distances
  below a quarter of the buckets get one bucket each and longer ones share log-spaced buckets up
  to max_distance. The log is taken in float32 in the same order as transformers, so values that
  fall exactly on a bucket boundary round the same way.
  """
  query = np.arange(length)[:, None]
  key = np.arange(length)[None, :]
  distance = query - key  # positive when the key comes before the query
  half = num_buckets // 2
  buckets = np.where(distance < 0, half, 0)
  distance = np.abs(distance)
  exact = half // 2
  ratio = np.maximum(distance, 1).astype(np.float32) / exact  # max(., 1): no log(0) warning
  log_scale = np.float32(math.log(max_distance / exact))
  far = exact + (np.log(ratio) / log_scale * (half - exact)).astype(np.int64)
  far = np.minimum(far, half - 1)
  buckets = buckets + np.where(distance < exact, distance, far)
  return buckets.astype(np.int32)


def _layer_norm(config: EncoderConfig, name: str) -> nn.LayerNorm:
  return nn.LayerNorm(epsilon=config.layer_norm_eps, dtype=jnp.float32,
                      param_dtype=jnp.float32, name=name)


def _residual_norm(norm: nn.LayerNorm, x: jax.Array, update: jax.Array) -> jax.Array:
  """norm(x + update) in float32, returned in x's dtype (post-LN residual)."""
  return norm(x.astype(jnp.float32) + update.astype(jnp.float32)).astype(x.dtype)


class Embeddings(nn.Module):
  """Token ids -> first hidden states."""
  config: EncoderConfig
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, ids: jax.Array, mask: jax.Array) -> jax.Array:
    """ids, mask: [B, S] (mask 1 on real tokens, right padded) -> [B, S, D] in dtype."""
    cfg = self.config
    embed = functools.partial(nn.Embed, features=cfg.hidden_size, dtype=self.dtype,
                              param_dtype=self.dtype)
    # Real tokens count from position_offset; padded slots get any valid id, they are masked.
    positions = jnp.maximum(jnp.cumsum(mask, axis=1) - 1, 0) * mask + cfg.position_offset
    x = embed(cfg.vocab_size, name="word")(ids).astype(jnp.float32)
    x += embed(cfg.max_position_embeddings, name="position")(positions).astype(jnp.float32)
    if cfg.type_vocab_size:
      # One sentence per input, so every token has type 0.
      x += embed(cfg.type_vocab_size, name="token_type")(jnp.zeros_like(ids)).astype(jnp.float32)
    return _layer_norm(cfg, "norm")(x).astype(self.dtype)


class RelativePositionBias(nn.Module):
  """MPNet's relative position bias, shared by all layers."""
  config: EncoderConfig

  @nn.compact
  def __call__(self, length: int) -> jax.Array:
    """length S (static) -> [1, H, S, S] float32 bias added to the attention logits."""
    cfg = self.config
    table = self.param("embedding", nn.initializers.normal(0.02),
                       (cfg.relative_buckets, cfg.num_heads), jnp.float32)
    # S is static, so the bucket matrix is a constant of the compiled function.
    buckets = relative_position_buckets(length, cfg.relative_buckets, cfg.relative_max_distance)
    return jnp.transpose(table[buckets], (2, 0, 1))[None]


class SelfAttention(nn.Module):
  """Multi-head self-attention with an additive bias (padding mask, relative positions)."""
  config: EncoderConfig
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array, bias: jax.Array) -> jax.Array:
    """x: [B, S, D]; bias: float32, broadcastable to [B, H, S, S] -> [B, S, D]."""
    cfg = self.config
    batch, length, _ = x.shape
    dense = functools.partial(nn.Dense, cfg.hidden_size, dtype=self.dtype, param_dtype=self.dtype)
    split = lambda t: t.reshape(batch, length, cfg.num_heads, cfg.head_dim)  # -> [B, S, H, K]
    q = split(dense(name="query")(x))
    k = split(dense(name="key")(x))
    v = split(dense(name="value")(x))
    logits = jnp.einsum("bqhk,bshk->bhqs", q, k).astype(jnp.float32) / math.sqrt(cfg.head_dim)
    probs = jax.nn.softmax(logits + bias, axis=-1).astype(self.dtype)
    context = jnp.einsum("bhqs,bshk->bqhk", probs, v).reshape(batch, length, cfg.hidden_size)
    return dense(name="out")(context)


class EncoderLayer(nn.Module):
  """Attention and MLP, each followed by residual add and LayerNorm (post-LN, as BERT)."""
  config: EncoderConfig
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array, bias: jax.Array) -> jax.Array:
    """x: [B, S, D]; bias: broadcastable to [B, H, S, S] -> [B, S, D]."""
    cfg = self.config
    x = _residual_norm(_layer_norm(cfg, "attention_norm"), x,
                       SelfAttention(cfg, self.dtype, name="attention")(x, bias))
    h = nn.Dense(cfg.intermediate_size, dtype=self.dtype, param_dtype=self.dtype,
                 name="mlp_in")(x)
    h = ACTIVATIONS[cfg.hidden_act](h)
    h = nn.Dense(cfg.hidden_size, dtype=self.dtype, param_dtype=self.dtype, name="mlp_out")(h)
    return _residual_norm(_layer_norm(cfg, "mlp_norm"), x, h)


class TransformerEncoder(nn.Module):
  """Token ids -> contextual token states (BERT or MPNet, as the config says)."""
  config: EncoderConfig
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, ids: jax.Array, mask: jax.Array) -> jax.Array:
    """ids, mask: [B, S] int32 (mask 1 on real tokens, right padded) -> [B, S, D] in dtype."""
    cfg = self.config
    x = Embeddings(cfg, self.dtype, name="embeddings")(ids, mask)
    bias = jnp.where(mask[:, None, None, :] > 0, 0.0, _MASKED_LOGIT).astype(jnp.float32)
    if cfg.relative_buckets:
      bias = bias + RelativePositionBias(cfg, name="relative_bias")(ids.shape[1])
    for i in range(cfg.num_layers):
      x = EncoderLayer(cfg, self.dtype, name=f"layer_{i}")(x, bias)
    return x


def pool(states: jax.Array, mask: jax.Array, mode: str) -> jax.Array:
  """Token states [B, S, D] and mask [B, S] -> sentence vectors [B, D] float32.

  Follows sentence-transformers' Pooling: cls = first token; mean / max over real tokens;
  lasttoken = the last real token.
  """
  states = states.astype(jnp.float32)
  real = (mask > 0)[..., None]  # [B, S, 1]
  if mode == "cls":
    return states[:, 0]
  if mode == "mean":
    total = jnp.sum(jnp.where(real, states, 0.0), axis=1)
    return total / jnp.maximum(jnp.sum(real, axis=1), 1e-9)
  if mode == "max":
    # sentence-transformers fills padded slots with -1e9 before the max; same here.
    return jnp.max(jnp.where(real, states, -1e9), axis=1)
  if mode == "lasttoken":
    positions = jnp.arange(mask.shape[1])[None, :]
    last = jnp.max(jnp.where(mask > 0, positions, 0), axis=1)  # [B]
    return jnp.take_along_axis(states, last[:, None, None], axis=1)[:, 0]
  raise ValueError(f"Unknown pooling mode {mode!r}; expected one of {POOLING_MODES}.")


def l2_normalize(x: jax.Array) -> jax.Array:
  """[B, D] -> rows of unit L2 norm (a zero row stays zero), float32."""
  x = x.astype(jnp.float32)
  return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-12)
