"""The KV cache: an explicit pytree of keys, values and the position held by each slot.

Layout: values [L, B, K, C, H], keys [L, B, K, H, C] (L layers, scanned; B rows; K KV heads;
C slots; H head width). Both are the right-hand operand of attention's two products, scores =
q [G*S, H] @ keys [H, C] and out = probs [G*S, C] @ values [C, H], so each is read in the
(contraction, output) order a matmul wants. Keys stored [C, H] had to be transposed inside the
scores product: profiled at 4x the time of the values product on the same bytes (a 64-row
SmolLM2 decode step on CPU, 46 of 365 ms).

All rows write to the same slots: a call with S new tokens per row fills slots
cursor .. cursor + S - 1 with one in-place dynamic_update_slice (a per-row offset would be a
scatter, several times slower per decode step on CPU). Rows of different prompt lengths are
right padded, so a row may have empty slots in the middle: `positions[b, c]` says which
position slot c holds for row b (-1 for none) and attention masks by position, never by slot.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from dpsynrag_jax.models.config import DecoderConfig


@flax.struct.dataclass
class KVCache:
  """k and v are stacked over layers, or (`unstack_layers`) tuples of per-layer arrays."""
  k: jax.Array          # [L, B, K, H, C] (transposed: see the module docstring)
  v: jax.Array          # [L, B, K, C, H]
  positions: jax.Array  # [B, C] int32 position held by each slot, -1 when empty
  lengths: jax.Array    # [B] int32 next position of each row (= tokens it holds)
  cursor: jax.Array     # [] int32 next free slot, shared by all rows

  @property
  def per_layer(self) -> bool:
    return isinstance(self.k, tuple)

  @property
  def capacity(self) -> int:
    return self.positions.shape[1]

  @property
  def batch_size(self) -> int:
    return self.positions.shape[0]


def init_cache(cfg: DecoderConfig, batch: int, capacity: int, dtype=jnp.float32) -> KVCache:
  shape = (cfg.num_layers, batch, cfg.num_kv_heads, capacity, cfg.head_dim)
  k_shape = shape[:3] + (cfg.head_dim, capacity)
  return KVCache(k=jnp.zeros(k_shape, dtype), v=jnp.zeros(shape, dtype),
                 positions=jnp.full((batch, capacity), -1, jnp.int32),
                 lengths=jnp.zeros((batch,), jnp.int32), cursor=jnp.zeros((), jnp.int32))


def append(cache: KVCache, new_k: jax.Array, new_v: jax.Array,
           new_lengths: jax.Array) -> KVCache:
  """Writes a call's keys [L, B, K, H, S] and values [L, B, K, S, H] at slots cursor .. + S - 1.

  Row b's first new_lengths[b] tokens are real; its padding slots get position -1. The caller
  guarantees cursor + S <= capacity (dynamic_update_slice would clamp silently).
  """
  s = new_v.shape[3]
  zero = jnp.zeros((), jnp.int32)
  at = (zero, zero, zero, cache.cursor, zero)
  at_k = (zero, zero, zero, zero, cache.cursor)
  offsets = jnp.arange(s, dtype=jnp.int32)[None, :]
  new_positions = jnp.where(offsets < new_lengths[:, None], cache.lengths[:, None] + offsets, -1)
  return KVCache(
      k=jax.lax.dynamic_update_slice(cache.k, new_k.astype(cache.k.dtype), at_k),
      v=jax.lax.dynamic_update_slice(cache.v, new_v.astype(cache.v.dtype), at),
      positions=jax.lax.dynamic_update_slice(cache.positions, new_positions, (zero, cache.cursor)),
      lengths=cache.lengths + new_lengths.astype(jnp.int32),
      cursor=cache.cursor + s)


def with_prefix(cache: KVCache, prefix_k: jax.Array, prefix_v: jax.Array) -> KVCache:
  """An empty cache whose first P slots hold a shared prefix (keys [L, 1, K, H, P], values
  [L, 1, K, P, H]) in every row."""
  p = prefix_v.shape[3]
  b = cache.batch_size
  k_shape = prefix_k.shape[:1] + (b,) + prefix_k.shape[2:]
  shape = prefix_v.shape[:1] + (b,) + prefix_v.shape[2:]
  zero = jnp.zeros((), jnp.int32)
  at = (zero,) * 5
  positions = jnp.where(jnp.arange(cache.capacity)[None, :] < p,
                        jnp.arange(cache.capacity)[None, :], -1)
  return KVCache(
      k=jax.lax.dynamic_update_slice(cache.k, jnp.broadcast_to(prefix_k, k_shape).astype(
          cache.k.dtype), at),
      v=jax.lax.dynamic_update_slice(cache.v, jnp.broadcast_to(prefix_v, shape).astype(
          cache.v.dtype), at),
      positions=jnp.broadcast_to(positions, (b, cache.capacity)).astype(jnp.int32),
      lengths=jnp.full((b,), p, jnp.int32), cursor=jnp.asarray(p, jnp.int32))


def write_rows(cache: KVCache, rows: KVCache, row0) -> KVCache:
  """`cache` with rows row0 .. row0 + b - 1 replaced by the b-row cache `rows`.

  rows' C' <= C slots land at slots 0 .. C' - 1; the rows' later slots keep what `cache` held
  (empty, for a fresh cache). The cursor is the caller's to set (chunks of rows prefilled to
  different lengths share one cache). `cache` may be per layer (unstack_layers), `rows` is
  stacked.
  """
  zero = jnp.zeros((), jnp.int32)
  if cache.per_layer:
    at = (row0, zero, zero, zero)
    write = lambda layers, new: tuple(
        jax.lax.dynamic_update_slice(a, new[i].astype(a.dtype), at) for i, a in enumerate(layers))
    k, v = write(cache.k, rows.k), write(cache.v, rows.v)
  else:
    at = (zero, row0, zero, zero, zero)
    k = jax.lax.dynamic_update_slice(cache.k, rows.k.astype(cache.k.dtype), at)
    v = jax.lax.dynamic_update_slice(cache.v, rows.v.astype(cache.v.dtype), at)
  return cache.replace(
      k=k, v=v,
      positions=jax.lax.dynamic_update_slice(cache.positions, rows.positions, (row0, zero)),
      lengths=jax.lax.dynamic_update_slice(cache.lengths, rows.lengths, (row0,)))


def unstack_layers(cache: KVCache) -> KVCache:
  """The same cache with k and v as tuples of per-layer arrays ([B, K, H, C] and [B, K, C, H]):
  the layout of decoder.decode_unrolled, where each layer's buffer is updated in place. A cache
  that is per layer already is returned as it is."""
  if cache.per_layer:
    return cache
  num_layers = cache.v.shape[0]
  return cache.replace(k=tuple(cache.k[i] for i in range(num_layers)),
                       v=tuple(cache.v[i] for i in range(num_layers)))
