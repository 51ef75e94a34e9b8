"""A FAISS inner-product index over unit embeddings (cosine similarity), saved as index.faiss."""

from __future__ import annotations

import logging
import os

import numpy as np

from dpsynrag_jax.faults import fault_point

# faiss announces at INFO which SIMD build it loaded, six lines per process.
logging.getLogger("faiss.loader").setLevel(logging.WARNING)


def build_index(embeddings: np.ndarray):
  """faiss.IndexFlatIP over [N, D] float32 unit rows (exact search; N is thousands)."""
  import faiss  # pylint: disable=g-import-not-at-top
  embeddings = np.ascontiguousarray(embeddings, np.float32)
  if embeddings.ndim != 2:
    raise ValueError(f"embeddings must be [N, D], got shape {embeddings.shape}.")
  index = faiss.IndexFlatIP(embeddings.shape[1])
  if len(embeddings):
    index.add(embeddings)
  return index


def save_index(index, path: str) -> None:
  import faiss  # pylint: disable=g-import-not-at-top
  tmp = path + ".tmp"
  faiss.write_index(index, tmp)
  fault_point(f"save:{os.path.basename(path)}")
  os.replace(tmp, path)


def load_index(path: str):
  import faiss  # pylint: disable=g-import-not-at-top
  if not os.path.exists(path):
    raise FileNotFoundError(f"No FAISS index at {path}.")
  return faiss.read_index(path)


def search(index, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
  """Top-k (scores [Q, k'], ids [Q, k']) with k' = min(k, index size)."""
  k = min(k, index.ntotal)
  if k == 0:
    empty = np.zeros((len(queries), 0))
    return empty.astype(np.float32), empty.astype(np.int64)
  return index.search(np.ascontiguousarray(queries, np.float32), k)
