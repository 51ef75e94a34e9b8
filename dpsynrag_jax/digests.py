"""sha256 digests of files, texts and ordered collections of texts, written once.

Used to check embedded model files (models.presets), to recognise a documents file appended
before (synrag.refresh), and to tie a build's private state to the documents it was built from
(synrag.pipeline). Digests of private documents are private state themselves: they identify
the corpus, so they stay under a work dir's private/.
"""

from __future__ import annotations

import hashlib
from typing import Sequence


def file_sha256(path: str) -> str:
  """Hex sha256 of a file's bytes, read in 4 MiB blocks."""
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 22), b""):
      digest.update(block)
  return digest.hexdigest()


def text_sha256s(texts: Sequence[str]) -> list[str]:
  """Hex sha256 of each text's UTF-8 bytes."""
  return [hashlib.sha256(t.encode("utf-8")).hexdigest() for t in texts]


def sequence_sha256(texts: Sequence[str]) -> str:
  """Hex sha256 over texts in order, each length-prefixed (so boundaries count)."""
  digest = hashlib.sha256()
  for t in texts:
    data = t.encode("utf-8")
    digest.update(len(data).to_bytes(8, "little"))
    digest.update(data)
  return digest.hexdigest()
