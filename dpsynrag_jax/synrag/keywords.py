"""Keyword extraction (DP-SynRAG step 1, before the noisy histogram).

Each document yields at most K DISTINCT ids of the public vocabulary V, whatever the extractor
does, so one document moves the histogram by at most sqrt(K) in L2. Two extractors:
  - `llm`: the paper's prompt, the model's words parsed and kept only if they are in V;
  - `lexical`: deterministic and fast on CPU: the document's K rarest words of V by the public
    Zipf frequency list.
Output: [N, K] int32 keyword ids, -1 where a document has fewer than K.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import tqdm

from dpsynrag_jax.synrag.vocabulary import PublicVocabulary, words_of

KEYWORD_PROMPT = ("Extract {K} single words from the following document that represent key "
                  "information specific to the content.\nDocument: {d}")


def _ids_matrix(rows: Sequence[Sequence[int]], K: int) -> np.ndarray:
  out = np.full((len(rows), K), -1, np.int32)
  for i, row in enumerate(rows):
    out[i, :len(row)] = row[:K]
  return out


def parse_keywords(text: str, vocab: PublicVocabulary, K: int) -> list[int]:
  """The first K distinct words of `text` that lie in V, as ids."""
  ids: list[int] = []
  for w in words_of(text):
    i = vocab.id(w)
    if i >= 0 and i not in ids:
      ids.append(i)
      if len(ids) == K:
        break
  return ids


def lexical_keywords(texts: Sequence[str], vocab: PublicVocabulary, K: int) -> np.ndarray:
  """Each document's K rarest distinct words of V (public Zipf order; ties by word)."""
  rows = []
  for text in texts:
    ids = {vocab.id(w) for w in words_of(text)} - {-1}
    rows.append(sorted(ids, key=lambda i: (vocab.zipf[i], vocab.words[i]))[:K])
  return _ids_matrix(rows, K)


def llm_keywords(lm, texts: Sequence[str], vocab: PublicVocabulary, K: int, *,
                 max_new_tokens: int = 48, batch_size: int = 32,
                 progress: bool = True) -> np.ndarray:
  """The paper's extractor: greedy answers to KEYWORD_PROMPT, parsed to ids in V."""
  rows = []
  starts = range(0, len(texts), batch_size)
  for start in tqdm.tqdm(starts, desc="keywords (llm)", unit="batch", disable=not progress):
    chunk = texts[start:start + batch_size]
    answers = lm.generate([KEYWORD_PROMPT.format(K=K, d=d) for d in chunk], max_new_tokens,
                          batch_size=batch_size)
    rows.extend(parse_keywords(a, vocab, K) for a in answers)
  return _ids_matrix(rows, K)
