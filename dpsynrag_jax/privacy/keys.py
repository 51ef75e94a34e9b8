"""PRNG streams: every method and every release draws from its own key, so no two share noise.

    seed -> PRNGKey(seed) -> fold_in(., STREAMS[name]) -> fold_in(., index) ...

  stream       used by                      then folded with
  histogram    DP-SynRAG keyword histogram  -
  clusters     DP-SynRAG, per cluster r     r, then 0 (re-ranking) / 1 (tokens) / 2 (topics)
  dp_synth     DP-Synth, per batch b        b
  dp_rag       DP-RAG, per question q       q, then 0 (retrieval) / 1 (tokens)
  aug_pe       Aug-PE, per voting round     round
  terms        DP-SynRAG term discovery     -

The first two keep the values DP-SynRAG always used (its releases are unchanged). Two releases
that shared a key on different data (or at different noise scales) would let their noise be
subtracted; keyed draws are also what makes a resumed run redraw exactly what it drew before.

`jax.random.PRNGKey` keeps a seed's low 32 bits only (2^32 would give seed 0's key, -1 the key
of 2^32 - 1), so seeds outside [0, 2^32) are refused rather than silently aliased.

Where the seed comes from (`noise_seed`). Noise that anyone can regenerate protects nothing: a
release whose config says seed 0 lets a reader redraw every Gaussian and Gumbel variable and
subtract it. So a build's noise seed is, by default (privacy.noise = 'secret'), 64 random bits
from the operating system's CSPRNG, drawn when the build starts and kept in its private/ side
(a resumed run reads it back, so it re-releases nothing new; no released file holds it). Mode
'seeded' uses the config's public seed: reproducible benchmarks and tests, private against no
one who knows the seed; the released config says so (privacy.noise). A 64-bit noise seed is
the raw threefry key [high word, low word], which for seeds below 2^32 is exactly
PRNGKey(seed): seeded releases are unchanged.
"""

from __future__ import annotations

import json
import os
import secrets

import jax
import jax.numpy as jnp
import numpy as np

SEED_RANGE = (0, 2**32)
NOISE_SEED_RANGE = (0, 2**64)
NOISE_MODES = ("secret", "seeded")
STREAMS = {"histogram": 1, "clusters": 2, "dp_synth": 3, "dp_rag": 4, "aug_pe": 5,
           "terms": 6}


def check_seed(seed) -> int:
  """seed as an int in [0, 2^32), or ValueError."""
  if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
    raise ValueError(f"seed must be an integer, got {seed!r}.")
  lo, hi = SEED_RANGE
  if not lo <= int(seed) < hi:
    raise ValueError(f"seed must lie in [0, 2^32) (a PRNG key holds 32 bits; {seed} would "
                     f"alias another seed's noise), got {seed}.")
  return int(seed)


def _check_noise_seed(seed) -> int:
  if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
    raise ValueError(f"noise seed must be an integer, got {seed!r}.")
  lo, hi = NOISE_SEED_RANGE
  if not lo <= int(seed) < hi:
    raise ValueError(f"noise seed must lie in [0, 2^64), got {seed}.")
  return int(seed)


def root_key(seed: int) -> jax.Array:
  """The raw threefry key of a noise seed in [0, 2^64): [seed >> 32, seed & (2^32 - 1)],
  which equals jax.random.PRNGKey(seed) for seeds below 2^32."""
  seed = _check_noise_seed(seed)
  return jnp.asarray(np.array([seed >> 32, seed & 0xFFFFFFFF], np.uint32))


def noise_seed(mode: str, public_seed: int, secret_path: str, *, create: bool) -> int:
  """The seed a build's noise is drawn from (see the module docstring).

  Args:
    mode: 'secret' (64 CSPRNG bits kept at `secret_path`) or 'seeded' (`public_seed`).
    secret_path: a file on the build's private side.
    create: draw and write the secret when the file is missing (the process that prepares the
      build); otherwise a missing file is an error (other processes, which must read the same
      secret).
  """
  if mode not in NOISE_MODES:
    raise ValueError(f"privacy.noise must be one of {NOISE_MODES}, got {mode!r}.")
  public_seed = check_seed(public_seed)
  if mode == "seeded":
    return public_seed
  if os.path.exists(secret_path):
    with open(secret_path, encoding="utf-8") as f:
      return _check_noise_seed(json.load(f)["noise_seed"])
  if not create:
    raise FileNotFoundError(f"{secret_path} is missing: the build's secret noise seed is "
                            "written by the process that prepares the build.")
  value = secrets.randbits(64)
  os.makedirs(os.path.dirname(os.path.abspath(secret_path)), exist_ok=True)
  tmp = f"{secret_path}.tmp{os.getpid()}"
  # Owner-only: the seed is as sensitive as the private data (it would let the noise be
  # subtracted from every release of this build).
  fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
  with os.fdopen(fd, "w", encoding="utf-8") as f:
    json.dump({"noise_seed": value}, f)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, secret_path)
  return value


def stream_key(seed: int, name: str, *indices: int) -> jax.Array:
  """The key of stream `name` for noise seed `seed` (a public seed in seeded mode, or a
  64-bit secret), folded with `indices` in order."""
  if name not in STREAMS:
    raise ValueError(f"Unknown PRNG stream {name!r}; expected one of {sorted(STREAMS)}.")
  key = jax.random.fold_in(root_key(seed), STREAMS[name])
  for i in indices:
    key = jax.random.fold_in(key, i)
  return key
