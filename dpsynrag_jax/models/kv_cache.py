"""The KV cache: an explicit pytree, one contiguous run of positions per row.

Row b's cache holds positions 0 .. lengths[b] - 1 in slots of the same index. Prompts are right
padded, and every call writes a row's new keys at its own offset lengths[b], so rows of different
prompt lengths decode side by side without holes; slots at or past lengths[b] are stale and
masked. Layout [L, B, C, K, H]: L layers (scanned), B rows, C slots, K KV heads, H head width.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from dpsynrag_jax.models.config import DecoderConfig


@flax.struct.dataclass
class KVCache:
  k: jax.Array        # [L, B, C, K, H]
  v: jax.Array        # [L, B, C, K, H]
  lengths: jax.Array  # [B] int32, valid positions per row

  @property
  def capacity(self) -> int:
    return self.k.shape[2]

  @property
  def batch_size(self) -> int:
    return self.k.shape[1]


def init_cache(cfg: DecoderConfig, batch: int, capacity: int, dtype=jnp.float32) -> KVCache:
  shape = (cfg.num_layers, batch, capacity, cfg.num_kv_heads, cfg.head_dim)
  return KVCache(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype),
                 lengths=jnp.zeros((batch,), jnp.int32))


def _write_rows(cache: jax.Array, new: jax.Array, offsets: jax.Array) -> jax.Array:
  """cache [L, B, C, K, H] with new [L, B, S, K, H] written at slot offsets[b] of row b."""
  def one_row(row_cache, row_new, offset):  # [L, C, K, H], [L, S, K, H], scalar
    zero = jnp.zeros((), offset.dtype)
    return jax.lax.dynamic_update_slice(row_cache, row_new.astype(row_cache.dtype),
                                        (zero, offset, zero, zero))
  return jax.vmap(one_row, in_axes=(1, 1, 0), out_axes=1)(cache, new, offsets)


def append(cache: KVCache, new_k: jax.Array, new_v: jax.Array,
           new_lengths: jax.Array) -> KVCache:
  """Writes a call's keys/values after each row's prefix; rows advance by new_lengths [B].

  The caller guarantees lengths + S <= capacity (dynamic_update_slice would clamp silently).
  """
  return KVCache(k=_write_rows(cache.k, new_k, cache.lengths),
                 v=_write_rows(cache.v, new_v, cache.lengths),
                 lengths=cache.lengths + new_lengths.astype(jnp.int32))


def broadcast_rows(cache: KVCache, batch: int) -> KVCache:
  """A one-row cache (e.g. a shared prompt prefix) repeated for `batch` rows."""
  rep = lambda a: jnp.broadcast_to(a, a.shape[:1] + (batch,) + a.shape[2:])
  return KVCache(k=rep(cache.k), v=rep(cache.v),
                 lengths=jnp.broadcast_to(cache.lengths, (batch,)))
