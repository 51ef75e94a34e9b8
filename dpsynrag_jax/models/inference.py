"""Jitted model calls over a KV cache, and the token-by-token decode loop.

The decode loop is a pure function over a small state (gemma's sampler style): the caller picks
how a token is chosen (`select`), so greedy answers, temperature sampling and the private
clipped-sum decode all run the same lax.while_loop on device, with no host round trip per token.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from typing import Any, Callable

import flax.struct
import jax
import jax.numpy as jnp

from dpsynrag_jax.models import kv_cache
from dpsynrag_jax.models.config import DecoderConfig
from dpsynrag_jax.models import decoder as decoder_lib
from dpsynrag_jax.models.decoder import Decoder

# Python-side trace counters: the bodies below run only when jax traces (compiles) them, so a test
# can assert that shapes inside one bucket reuse a compilation.
TRACE_COUNTS: collections.Counter = collections.Counter()


def _forward(params, cfg: DecoderConfig, dtype, *args, **kwargs):
  """Decoder's call: the layer scan over stacked parameters, or the layers unrolled over
  parameters held per layer (decoder.unstack_params, the CPU default)."""
  if decoder_lib.per_layer(params):
    return decoder_lib.forward_unrolled(params, cfg, dtype, *args, **kwargs)
  return Decoder(cfg, dtype).apply({"params": params}, *args, **kwargs)


def extend(params, cfg: DecoderConfig, dtype, cache: kv_cache.KVCache, tokens, new_lengths):
  """Feeds tokens [B, S] (row b's first new_lengths[b] valid) after the cache.

  Returns (logits at each row's last new token [B, V] float32, updated cache).
  """
  logits, new_k, new_v = _forward(
      params, cfg, dtype, tokens, cache.k, cache.v, cache.positions, cache.lengths,
      logits_index=jnp.maximum(new_lengths - 1, 0),
      new_lengths=None if tokens.shape[1] == 1 else new_lengths)
  return logits, kv_cache.append(cache, new_k, new_v, new_lengths)


@functools.partial(jax.jit, static_argnames=("cfg", "dtype"), donate_argnames=("cache",))
def prefill(params, cfg, dtype, cache, tokens, new_lengths):
  """Jitted _extend for a prompt chunk [B, S]; the cache buffer is donated (updated in place)."""
  TRACE_COUNTS["prefill"] += 1
  return extend(params, cfg, dtype, cache, tokens, new_lengths)


@functools.partial(jax.jit, static_argnames=("cfg", "dtype"))
def full_logits(params, cfg, dtype, tokens, lengths=None):
  """Logits at every position [B, S, V] float32 of a plain causal forward (no cache).

  lengths: None, or [B] int32 real tokens per row (right padding after them, never read)."""
  TRACE_COUNTS["full_logits"] += 1
  b = tokens.shape[0]
  cache = kv_cache.init_cache(cfg, b, 0, dtype)
  logits, _, _ = _forward(params, cfg, dtype, tokens, cache.k, cache.v, cache.positions,
                          cache.lengths, new_lengths=lengths)
  return logits


def unrolled_decode_default() -> bool:
  """Whether decode loops unroll the layers (decoder.decode_unrolled) by default, and models
  hold their weights per layer (decoder.unstack_params): on CPU, where the layer scan's
  per-step slices are copies (profiled). Elsewhere the scan (one compiled layer) stays."""
  return jax.default_backend() == "cpu"


def _one_token_step(params, cfg, dtype, unrolled: bool):
  """(cache, tokens [B]) -> (logits [B, V], cache): the decode loop's step, and the cache layout
  it wants (unrolled: per-layer buffers, see kv_cache.unstack_layers)."""
  if not unrolled:
    ones = lambda tokens: jnp.ones(tokens.shape, jnp.int32)
    return lambda cache, tokens: extend(params, cfg, dtype, cache, tokens[:, None], ones(tokens))
  # Per-layer already where they are held so (CPU); else sliced once, outside the loop.
  layer_params = decoder_lib.split_layers(params)

  def step(cache, tokens):
    logits, k, v, positions = decoder_lib.decode_unrolled(
        params, layer_params, cfg, dtype, cache.k, cache.v, cache.positions, cache.lengths,
        cache.cursor, tokens)
    return logits, cache.replace(k=k, v=v, positions=positions, lengths=cache.lengths + 1,
                                 cursor=cache.cursor + 1)
  return step


@dataclasses.dataclass(frozen=True)
class Sampler:
  """Per-row token choice: greedy at temperature 0, else softmax(logits / temperature)."""
  temperature: float = 0.0

  def __call__(self, key, logits, aux):
    del aux
    if self.temperature <= 0:
      return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    return jax.random.categorical(key, logits / self.temperature, axis=-1).astype(jnp.int32)


@flax.struct.dataclass
class DecodeState:
  step: jax.Array      # scalar int32
  key: jax.Array
  logits: jax.Array    # [B, V] next-token logits
  cache: kv_cache.KVCache
  tokens: jax.Array    # [B, T] chosen tokens, pad after a row ends
  done: jax.Array      # [B] bool
  select_state: Any = ()   # a stateful select's state (see run_decode_loop)


def run_decode_loop(params, cfg, dtype, cache, logits, key, aux=None, *, max_new_tokens: int,
                    select: Callable[[jax.Array, jax.Array, Any], jax.Array],
                    eos_ids: tuple[int, ...], pad_id: int, unrolled: bool | None = None,
                    padding=None, return_state: bool = False):
  """Chooses up to max_new_tokens tokens per row in one on-device loop (not jitted itself).

  Args:
    logits: [B, V] logits of each row's next token (from prefill).
    select: (key, logits [B, V], aux) -> tokens [B]; hashable (a frozen dataclass), static.
      A stateful select (its `stateful` is True) also has initial_state(key) -> state and
      step(key, logits, aux, state) -> (tokens [B], state), which the loop calls instead.
      Optional hooks of a select that runs several independent groups of rows in one batch
      (private_decode's packed clusters): fold_in(key, step) -> the step's key (default
      jax.random.fold_in), and hold(state, new_state, done [B]) -> the state to carry, which
      keeps a finished group's state while the others go on.
    aux: any pytree select needs (e.g. a row mask); passed through unchanged.
    eos_ids: a row is done once it emits one of these (the EOS itself is kept).
    unrolled: run the steps with unrolled layers (None: unrolled_decode_default()).
    padding: optional [B] bool, rows that are batch padding: done from the start (they emit
      pad_id), so the loop stops as soon as every real row has ended.
    return_state: also return the final DecodeState (its cache, its select_state). A caller
      that donates the cache to a jitted program returns the cache so that XLA can alias the
      two buffers and run the loop in place on the donated one (without an output of its
      shape, a donated input cannot be reused and the loop works on a copy).

  Returns:
    (tokens [B, max_new_tokens] int32, lengths [B] int32 tokens up to and including EOS), and
    the final DecodeState when return_state.
  """
  b = logits.shape[0]
  eos = jnp.asarray(eos_ids, jnp.int32)
  unrolled = unrolled_decode_default() if unrolled is None else unrolled
  step = _one_token_step(params, cfg, dtype, unrolled)
  if unrolled:
    cache = kv_cache.unstack_layers(cache)

  def cond(state: DecodeState):
    return (state.step < max_new_tokens) & ~jnp.all(state.done)

  stateful = getattr(select, "stateful", False)

  fold_in = getattr(select, "fold_in", jax.random.fold_in)

  def body(state: DecodeState):
    # Keyed by step, so a token's randomness does not depend on how the loop is run.
    step_key = fold_in(state.key, state.step)
    if stateful:
      token, select_state = select.step(step_key, state.logits, aux, state.select_state)
      if hasattr(select, "hold"):
        select_state = select.hold(state.select_state, select_state, state.done)
    else:
      token, select_state = select(step_key, state.logits, aux), state.select_state
    token = jnp.where(state.done, pad_id, token)
    tokens = jax.lax.dynamic_update_slice(state.tokens, token[:, None], (0, state.step))
    done = state.done | jnp.isin(token, eos)
    next_logits, cache = step(state.cache, token)
    return DecodeState(step=state.step + 1, key=state.key, logits=next_logits, cache=cache,
                       tokens=tokens, done=done, select_state=select_state)

  done = jnp.zeros((b,), bool) if padding is None else jnp.asarray(padding, bool)
  state = DecodeState(step=jnp.zeros((), jnp.int32), key=key, logits=logits, cache=cache,
                      tokens=jnp.full((b, max_new_tokens), pad_id, jnp.int32), done=done,
                      select_state=select.initial_state(key) if stateful else ())
  state = jax.lax.while_loop(cond, body, state)
  emitted = jnp.arange(max_new_tokens)[None, :] < state.step
  is_eos = jnp.isin(state.tokens, eos) & emitted
  first_eos = jnp.where(jnp.any(is_eos, axis=1), jnp.argmax(is_eos, axis=1) + 1, state.step)
  if return_state:
    return state.tokens, first_eos.astype(jnp.int32), state
  return state.tokens, first_eos.astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("cfg", "dtype", "max_new_tokens", "select",
                                             "eos_ids", "pad_id"))
def decode_loop(params, cfg, dtype, cache, logits, key, aux=None, *, max_new_tokens: int,
                select, eos_ids: tuple[int, ...], pad_id: int, padding=None):
  """Jitted run_decode_loop."""
  TRACE_COUNTS["decode_loop"] += 1
  return run_decode_loop(params, cfg, dtype, cache, logits, key, aux,
                         max_new_tokens=max_new_tokens, select=select, eos_ids=eos_ids,
                         pad_id=pad_id, padding=padding)
