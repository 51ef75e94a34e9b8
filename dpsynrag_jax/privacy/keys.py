"""PRNG streams: every method and every release draws from its own key, so no two share noise.

    seed -> PRNGKey(seed) -> fold_in(., STREAMS[name]) -> fold_in(., index) ...

  stream       used by                      then folded with
  histogram    DP-SynRAG keyword histogram  -
  clusters     DP-SynRAG, per cluster r     r, then 0 (re-ranking) / 1 (tokens)
  dp_synth     DP-Synth, per batch b        b
  dp_rag       DP-RAG, per question q       q, then 0 (retrieval) / 1 (tokens)
  aug_pe       Aug-PE, per voting round     round

The first two keep the values DP-SynRAG always used (its releases are unchanged). Two releases
that shared a key on different data (or at different noise scales) would let their noise be
subtracted; keyed draws are also what makes a resumed run redraw exactly what it drew before.

`jax.random.PRNGKey` keeps a seed's low 32 bits only (2^32 would give seed 0's key, -1 the key
of 2^32 - 1), so seeds outside [0, 2^32) are refused rather than silently aliased.
"""

from __future__ import annotations

import jax
import numpy as np

SEED_RANGE = (0, 2**32)
STREAMS = {"histogram": 1, "clusters": 2, "dp_synth": 3, "dp_rag": 4, "aug_pe": 5}


def check_seed(seed) -> int:
  """seed as an int in [0, 2^32), or ValueError."""
  if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
    raise ValueError(f"seed must be an integer, got {seed!r}.")
  lo, hi = SEED_RANGE
  if not lo <= int(seed) < hi:
    raise ValueError(f"seed must lie in [0, 2^32) (a PRNG key holds 32 bits; {seed} would "
                     f"alias another seed's noise), got {seed}.")
  return int(seed)


def stream_key(seed: int, name: str, *indices: int) -> jax.Array:
  """The key of stream `name` for `seed`, folded with `indices` in order."""
  if name not in STREAMS:
    raise ValueError(f"Unknown PRNG stream {name!r}; expected one of {sorted(STREAMS)}.")
  key = jax.random.fold_in(jax.random.PRNGKey(check_seed(seed)), STREAMS[name])
  for i in indices:
    key = jax.random.fold_in(key, i)
  return key
