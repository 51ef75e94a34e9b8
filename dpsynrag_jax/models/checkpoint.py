"""Finding and reading Hugging Face style checkpoints (local folder or hub id).

Only safetensors are read: they load without executing code and without torch. A folder holds
either `model.safetensors` or shards listed in `model.safetensors.index.json`.
"""

from __future__ import annotations

import json
import os
from typing import Mapping

import ml_dtypes
import numpy as np


class CheckpointError(ValueError):
  """A checkpoint is missing, unreadable, or does not match its config."""


def resolve_checkpoint_dir(name_or_path: str) -> str:
  """Returns a local folder for a HF folder path or a hub id (downloaded when online).

  Raises CheckpointError naming what was tried when neither works.
  """
  if os.path.isdir(name_or_path):
    return name_or_path
  if os.path.exists(name_or_path):
    raise CheckpointError(f"{name_or_path!r} is a file, expected a checkpoint folder.")
  looks_like_path = name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") > 1
  if looks_like_path or "/" not in name_or_path:
    raise CheckpointError(
        f"No checkpoint folder at {name_or_path!r} and it is not a hub id of the form "
        "'owner/name'.")
  try:
    import huggingface_hub  # pylint: disable=g-import-not-at-top
    return huggingface_hub.snapshot_download(
        name_or_path, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt",
                                      "1_Pooling/*", "tokenizer*"])
  except Exception as e:  # the hub raises many types; all mean "could not get it"
    raise CheckpointError(
        f"Could not download {name_or_path!r} from the Hugging Face hub ({type(e).__name__}: "
        f"{e}). Offline? Pass a local checkpoint folder instead.") from e


def read_json(path: str) -> dict:
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except FileNotFoundError as e:
    raise CheckpointError(f"Missing {os.path.basename(path)} in {os.path.dirname(path)}.") from e
  except json.JSONDecodeError as e:
    raise CheckpointError(f"{path} is not valid JSON: {e}") from e


def safetensors_files(folder: str) -> list[str]:
  """The safetensors files of a checkpoint folder, shards in index order."""
  index = os.path.join(folder, "model.safetensors.index.json")
  if os.path.exists(index):
    weight_map = read_json(index).get("weight_map", {})
    names = sorted(set(weight_map.values()))
    if not names:
      raise CheckpointError(f"{index} lists no shards.")
    return [os.path.join(folder, n) for n in names]
  single = os.path.join(folder, "model.safetensors")
  if os.path.exists(single):
    return [single]
  others = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
  if others:
    return [os.path.join(folder, f) for f in others]
  raise CheckpointError(
      f"No safetensors weights in {folder} (expected model.safetensors or "
      "model.safetensors.index.json). PyTorch .bin checkpoints are not read: convert them with "
      "transformers' save_pretrained(safe_serialization=True).")


_SAFETENSORS_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
    "BOOL": np.bool_,
}


def read_safetensors_file(path: str) -> dict[str, np.ndarray]:
  """Memory-maps one safetensors file: {name: array}, bf16 included (via ml_dtypes).

  The format is an 8-byte little-endian header length, a JSON header of
  {name: {dtype, shape, data_offsets}}, then the raw bytes. Reading it directly keeps bf16
  checkpoints in bf16 (safetensors' own NumPy path rejects them) and costs no copy.
  """
  try:
    size = os.path.getsize(path)
    with open(path, "rb") as f:
      header_len = int.from_bytes(f.read(8), "little")
      if header_len <= 0 or 8 + header_len > size:
        raise ValueError(f"header length {header_len} does not fit a {size}-byte file")
      header = json.loads(f.read(header_len))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + header_len)
    tensors = {}
    for name, info in header.items():
      if name == "__metadata__":
        continue
      dtype = np.dtype(_SAFETENSORS_DTYPES[info["dtype"]])
      begin, end = info["data_offsets"]
      shape = tuple(info["shape"])
      if end > data.size or end - begin != int(np.prod(shape)) * dtype.itemsize:
        raise ValueError(f"tensor {name!r} lies outside the file or has the wrong byte count")
      tensors[name] = data[begin:end].view(dtype).reshape(shape)
    return tensors
  except FileNotFoundError as e:
    raise CheckpointError(f"Missing checkpoint file {path}.") from e
  except (ValueError, KeyError, UnicodeDecodeError) as e:
    raise CheckpointError(f"Could not read {path}: corrupt or not safetensors ({e}).") from e


def read_safetensors(folder: str) -> dict[str, np.ndarray]:
  """All tensors of a checkpoint folder (every shard), memory-mapped, keyed by HF name."""
  tensors: dict[str, np.ndarray] = {}
  for path in safetensors_files(folder):
    tensors.update(read_safetensors_file(path))
  return tensors


def take(tensors: Mapping[str, np.ndarray], name: str, source: str) -> np.ndarray:
  """tensors[name], with an error naming the checkpoint when it is absent."""
  try:
    return tensors[name]
  except KeyError:
    close = [k for k in tensors if k.split(".")[-1] == name.split(".")[-1]][:3]
    raise CheckpointError(
        f"Checkpoint {source} has no tensor {name!r} (some present: {close}). Is the config's "
        "architecture right for these weights?") from None


def check_shape(name: str, array: np.ndarray, expected: tuple[int, ...], source: str) -> None:
  if tuple(array.shape) != tuple(expected):
    raise CheckpointError(
        f"Tensor {name!r} in {source} has shape {tuple(array.shape)} but the config implies "
        f"{tuple(expected)}: checkpoint and config do not match.")
