"""The KV cache: an explicit pytree of keys, values and the position held by each slot.

Keys and values are one array per layer, [B, K, C, H]: B rows, K KV heads, C slots, H head
width; heads before slots so that attention reads the cache as a batched matmul without a
transpose, and separate per-layer arrays so that no step copies a layer's slice out of a
stacked array (see decoder.py).

All rows write to the same slots: a call with S new tokens per row fills slots
cursor .. cursor + S - 1 with one in-place dynamic_update_slice per layer (a per-row offset
would be a scatter, several times slower per decode step on CPU). Rows of different prompt
lengths are right padded, so a row may have empty slots in the middle: `positions[b, c]` says
which position slot c holds for row b (-1 for none) and attention masks by position, never by
slot.
"""

from __future__ import annotations

from typing import Sequence

import flax.struct
import jax
import jax.numpy as jnp

from dpsynrag_jax.models.config import DecoderConfig


@flax.struct.dataclass
class KVCache:
  k: tuple[jax.Array, ...]  # L x [B, K, C, H]
  v: tuple[jax.Array, ...]  # L x [B, K, C, H]
  positions: jax.Array      # [B, C] int32 position held by each slot, -1 when empty
  lengths: jax.Array        # [B] int32 next position of each row (= tokens it holds)
  cursor: jax.Array         # [] int32 next free slot, shared by all rows

  @property
  def capacity(self) -> int:
    return self.positions.shape[1]

  @property
  def batch_size(self) -> int:
    return self.positions.shape[0]


def init_cache(cfg: DecoderConfig, batch: int, capacity: int, dtype=jnp.float32) -> KVCache:
  shape = (batch, cfg.num_kv_heads, capacity, cfg.head_dim)
  zeros = lambda: tuple(jnp.zeros(shape, dtype) for _ in range(cfg.num_layers))
  return KVCache(k=zeros(), v=zeros(),
                 positions=jnp.full((batch, capacity), -1, jnp.int32),
                 lengths=jnp.zeros((batch,), jnp.int32), cursor=jnp.zeros((), jnp.int32))


def _write(caches: Sequence[jax.Array], news: Sequence[jax.Array], slot) -> tuple:
  zero = jnp.zeros((), jnp.int32)
  return tuple(jax.lax.dynamic_update_slice(c, n.astype(c.dtype), (zero, zero, slot, zero))
               for c, n in zip(caches, news))


def append(cache: KVCache, new_k: Sequence[jax.Array], new_v: Sequence[jax.Array],
           new_lengths: jax.Array) -> KVCache:
  """Writes a call's keys/values (L x [B, K, S, H]) at slots cursor .. cursor + S - 1.

  Row b's first new_lengths[b] tokens are real; its padding slots get position -1. The caller
  guarantees cursor + S <= capacity (dynamic_update_slice would clamp silently).
  """
  s = new_k[0].shape[2]
  offsets = jnp.arange(s, dtype=jnp.int32)[None, :]
  new_positions = jnp.where(offsets < new_lengths[:, None], cache.lengths[:, None] + offsets, -1)
  zero = jnp.zeros((), jnp.int32)
  return KVCache(
      k=_write(cache.k, new_k, cache.cursor), v=_write(cache.v, new_v, cache.cursor),
      positions=jax.lax.dynamic_update_slice(cache.positions, new_positions, (zero, cache.cursor)),
      lengths=cache.lengths + new_lengths.astype(jnp.int32),
      cursor=cache.cursor + s)


def with_prefix(cache: KVCache, prefix_k: Sequence[jax.Array],
                prefix_v: Sequence[jax.Array]) -> KVCache:
  """An empty cache whose first P slots hold a shared prefix (L x [1, K, P, H]) in every row."""
  p = prefix_k[0].shape[2]
  b = cache.batch_size
  broadcast = lambda xs: [jnp.broadcast_to(x, (b,) + x.shape[1:]) for x in xs]
  zero = jnp.zeros((), jnp.int32)
  slots = jnp.arange(cache.capacity)[None, :]
  return KVCache(
      k=_write(cache.k, broadcast(prefix_k), zero), v=_write(cache.v, broadcast(prefix_v), zero),
      positions=jnp.broadcast_to(jnp.where(slots < p, slots, -1), (b, cache.capacity)).astype(
          jnp.int32),
      lengths=jnp.full((b,), p, jnp.int32), cursor=jnp.asarray(p, jnp.int32))
