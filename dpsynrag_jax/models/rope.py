"""Rotary position embeddings (rotate-half layout) with the checkpoint's frequency scaling."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from dpsynrag_jax.models.config import DecoderConfig, RopeConfig


def _base_inv_freq(theta: float, rotary_dim: int) -> np.ndarray:
  return 1.0 / theta ** (np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim)


def _llama3_inv_freq(inv_freq: np.ndarray, rope: RopeConfig) -> np.ndarray:
  """Llama 3.1: long wavelengths slowed by `factor`, short kept, a smooth ramp between."""
  old_len = rope.original_max_position_embeddings
  low_wavelen = old_len / rope.low_freq_factor
  high_wavelen = old_len / rope.high_freq_factor
  wavelen = 2 * math.pi / inv_freq
  scaled = np.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
  smooth = (old_len / wavelen - rope.low_freq_factor) / (
      rope.high_freq_factor - rope.low_freq_factor)
  smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
  medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
  return np.where(medium, smoothed, scaled)


def inverse_frequencies(cfg: DecoderConfig) -> tuple[np.ndarray, np.ndarray]:
  """(short, long) inverse frequencies [rotary_dim / 2], float32.

  They differ only for LongRoPE, which switches to `long` once a sequence passes the original
  context length.
  """
  rope = cfg.rope
  inv = _base_inv_freq(rope.theta, cfg.rotary_dim)
  if rope.rope_type == "linear":
    inv = inv / rope.factor
  elif rope.rope_type == "llama3":
    inv = _llama3_inv_freq(inv, rope)
  if rope.rope_type == "longrope":
    half = cfg.rotary_dim // 2
    short = np.asarray(rope.short_factor or (1.0,) * half, np.float64)
    long = np.asarray(rope.long_factor or (1.0,) * half, np.float64)
    if short.shape != (half,) or long.shape != (half,):
      raise ValueError(f"LongRoPE factors must have {half} entries (rotary_dim / 2).")
    return (inv / short).astype(np.float32), (inv / long).astype(np.float32)
  return inv.astype(np.float32), inv.astype(np.float32)


def rotate_half(x: jnp.ndarray) -> jnp.ndarray:
  first, second = jnp.split(x, 2, axis=-1)
  return jnp.concatenate([-second, first], axis=-1)


def cos_sin(cfg: DecoderConfig, positions: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
  """cos, sin tables [B, S, rotary_dim] float32 for integer positions [B, S]."""
  short, long = inverse_frequencies(cfg)
  inv = jnp.asarray(short)
  if cfg.rope.rope_type == "longrope":
    # Like transformers: the whole call uses long factors once any position passes the
    # original context length.
    past_original = jnp.max(positions) + 1 > cfg.rope.original_max_position_embeddings
    inv = jnp.where(past_original, jnp.asarray(long), inv)
  angles = positions.astype(jnp.float32)[..., None] * inv
  angles = jnp.concatenate([angles, angles], axis=-1)
  scale = cfg.rope.attention_factor if cfg.rope.rope_type == "longrope" else 1.0
  return jnp.cos(angles) * scale, jnp.sin(angles) * scale


def apply_rotary(x: jnp.ndarray, cos: jnp.ndarray, sin: jnp.ndarray) -> jnp.ndarray:
  """Rotates the leading rotary_dim features of each head: x [B, S, N, Dh], cos/sin [B, S, R]."""
  rotary_dim = cos.shape[-1]
  cos, sin = cos[:, :, None, :], sin[:, :, None, :]
  x_rot, x_pass = x[..., :rotary_dim], x[..., rotary_dim:]
  x32 = x_rot.astype(jnp.float32)
  rotated = (x32 * cos + rotate_half(x32) * sin).astype(x.dtype)
  if x_pass.shape[-1] == 0:
    return rotated
  return jnp.concatenate([rotated, x_pass], axis=-1)
