"""Self-filtering (DP-SynRAG step 5): the LLM keeps a synthetic text only if it answers YES.

Free post-processing: the prompt sees only the (already private) synthetic text. The answer is
read from the next-token distribution: keep when P(YES) > P(NO), each summed over the usual
spellings, so a model that would write "Yes." or " YES" is read the same way.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from scipy.special import logsumexp

FILTER_PROMPTS = {
    "medical": ("Does the following document contain any specific diagnosis names, even if they "
                "are fictional? Answer only YES or NO.\nDocument: {y}\nAnswer:"),
    "movielens": ("Does the following document contain specific movie titles released in the "
                  "20th century? Answer only YES or NO.\nDocument: {y}\nAnswer:"),
}



def filter_prompt(name_or_template: str) -> str:
  """A FILTER_PROMPTS key's prompt, or the argument itself (a template with {y})."""
  return FILTER_PROMPTS.get(name_or_template, name_or_template)


_YES = ("YES", "Yes", "yes", " YES", " Yes", " yes")
_NO = ("NO", "No", "no", " NO", " No", " no")


def _first_tokens(lm, spellings: Sequence[str]) -> list[int]:
  ids = {ids[0] for ids in lm.encode(list(spellings)) if ids}
  return sorted(ids)


def yes_no_log_odds(lm, texts: Sequence[str], prompt: str, batch_size: int = 32) -> np.ndarray:
  """[N] log P(YES) - log P(NO) of the answer to `prompt` filled with each text."""
  if "{y}" not in prompt:
    raise ValueError("A self-filter prompt needs a {y} slot for the synthetic text.")
  yes, no = _first_tokens(lm, _YES), _first_tokens(lm, _NO)
  if set(yes) & set(no):
    raise ValueError("The tokenizer maps YES and NO to a shared first token.")
  logits = lm.next_token_logits([prompt.format(y=t) for t in texts], batch_size=batch_size)
  return logsumexp(logits[:, yes], axis=1) - logsumexp(logits[:, no], axis=1)


def self_filter(lm, texts: Sequence[str], prompt: str, batch_size: int = 32) -> np.ndarray:
  """[N] bool: keep texts the model says YES to."""
  if not texts:
    return np.zeros((0,), bool)
  return yes_no_log_odds(lm, texts, prompt, batch_size) > 0
