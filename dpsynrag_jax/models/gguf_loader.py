"""GGUF files: config from the metadata, tensors dequantised on access with the `gguf` package."""

from __future__ import annotations

import os
from typing import Iterator, Mapping

import numpy as np

from dpsynrag_jax.models.checkpoint import CheckpointError
from dpsynrag_jax.models.config import DecoderConfig, RopeConfig

SUPPORTED_GGUF_ARCHITECTURES = ("llama", "qwen2")


def open_gguf(path: str):
  """A gguf.GGUFReader, with a clear error for a missing or corrupt file."""
  if not os.path.exists(path):
    raise CheckpointError(f"No GGUF file at {path!r}.")
  import gguf  # pylint: disable=g-import-not-at-top
  try:
    return gguf.GGUFReader(path)
  except Exception as e:  # the reader raises ValueError/struct errors/IndexError on bad bytes
    raise CheckpointError(f"Could not read {path}: corrupt or not GGUF ({type(e).__name__}: "
                          f"{e}).") from e


def metadata(reader) -> dict:
  """Scalar and string metadata (token lists skipped: they are large and read by tokenizers)."""
  out = {}
  for key, field in reader.fields.items():
    if key.startswith("tokenizer.ggml.") and key.endswith(("tokens", "scores", "token_type",
                                                           "merges")):
      continue
    try:
      out[key] = field.contents()
    except Exception:  # pylint: disable=broad-except
      continue  # fields of exotic types are not needed for the config
  return out


class DequantisedTensors(Mapping[str, np.ndarray]):
  """name -> float32 [out, in] array, dequantised when first read."""

  def __init__(self, reader):
    self._by_name = {t.name: t for t in reader.tensors}

  def __getitem__(self, name: str) -> np.ndarray:
    import gguf  # pylint: disable=g-import-not-at-top
    t = self._by_name[name]
    return np.asarray(gguf.dequantize(t.data, t.tensor_type), np.float32)

  def __iter__(self) -> Iterator[str]:
    return iter(self._by_name)

  def __len__(self) -> int:
    return len(self._by_name)

  def shape(self, name: str) -> tuple[int, ...]:
    """Torch-order shape [out, in] without dequantising (GGUF stores ne in reverse)."""
    return tuple(int(d) for d in reversed(self._by_name[name].shape))


def config_from_gguf(meta: Mapping, tensors: DequantisedTensors, source: str) -> DecoderConfig:
  arch = meta.get("general.architecture")
  if arch not in SUPPORTED_GGUF_ARCHITECTURES:
    raise CheckpointError(
        f"{source}: GGUF architecture {arch!r} is not supported (supported: "
        f"{SUPPORTED_GGUF_ARCHITECTURES}); load the HF checkpoint folder instead.")
  if "rope_freqs.weight" in tensors:
    raise CheckpointError(
        f"{source}: this GGUF scales rotary frequencies with a rope_freqs tensor (Llama 3.1 "
        "style), which the GGUF path does not read; load the model's HF folder instead.")
  get = lambda key, default=None: meta.get(f"{arch}.{key}", default)
  try:
    hidden = int(get("embedding_length"))
    heads = int(get("attention.head_count"))
    vocab = tensors.shape("token_embd.weight")[0]
    head_dim = int(get("attention.key_length") or hidden // heads)
    return DecoderConfig(
        model_type="llama" if arch == "llama" else "qwen2",
        vocab_size=int(get("vocab_size") or vocab),
        hidden_size=hidden,
        intermediate_size=int(get("feed_forward_length")),
        num_layers=int(get("block_count")),
        num_heads=heads,
        num_kv_heads=int(get("attention.head_count_kv") or heads),
        head_dim=head_dim,
        rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-6)),
        rope=RopeConfig(theta=float(get("rope.freq_base", 10000.0))),
        rotary_dim=int(get("rope.dimension_count") or head_dim),
        max_position_embeddings=int(get("context_length", 8192)),
        qkv_bias=arch == "qwen2",
        tie_word_embeddings="output.weight" not in tensors,
    )
  except (TypeError, KeyError) as e:
    raise CheckpointError(f"{source}: GGUF metadata lacks a field the config needs ({e}).") from e
