"""Public candidate tokens for the private decode: the tokens of a public term list.

With generation.candidates = n > 0 each private token is drawn from the public row's top-n
tokens plus these ids. Both are computed without the private documents (a term list is fixed
before any document is read: the task's public vocabulary, e.g. Medical Synth's table of disease,
symptom and treatment names, or a medical terminology for a real deployment), so restricting
the range of the exponential mechanism costs no privacy.
"""

from __future__ import annotations

import os
from typing import Sequence


def public_terms(source: str) -> list[str]:
  """Terms of `source`: 'medical_synth' (its public tables) or a text file, one term per line."""
  if not source:
    return []
  if source == "medical_synth":
    from dpsynrag_jax.data import medical_synth  # pylint: disable=g-import-not-at-top
    return medical_synth.public_terms()
  if os.path.isfile(source):
    with open(source, encoding="utf-8") as f:
      return [line.strip() for line in f if line.strip()]
  raise ValueError(f"generation.candidate_terms must be 'medical_synth' or a file of terms, "
                   f"got {source!r}.")


def term_token_ids(lm, terms: Sequence[str]) -> list[int]:
  """Token ids of every term as it appears mid-sentence and at a line start, plus EOS; none
  for no terms."""
  if not terms:
    return []
  variants = [v for t in terms for v in (t, " " + t, t.lower(), " " + t.lower())]
  ids = {i for row in lm.encode(variants) for i in row} if variants else set()
  ids.update(i for i in lm.eos_ids if 0 <= i < lm.config.vocab_size)
  return sorted(ids)
