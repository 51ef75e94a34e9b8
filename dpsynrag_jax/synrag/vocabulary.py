"""The fixed public keyword vocabulary V (DP-SynRAG step 1).

V must not depend on the private data: the noisy histogram is released over V, so a word that
enters V because a private document holds it would leak. The paper uses NLTK's English word
list minus stopwords; NLTK's lists are data downloads, not part of its PyPI package, so we take
the word list the `wordfreq` package ships: the most frequent English words, alphabetic, at least
3 letters, minus the English function words below. wordfreq's Zipf frequencies also rank a
document's words for the deterministic `lexical` keyword extractor (rarest first).
"""

from __future__ import annotations

import functools
import re
from typing import Sequence

import numpy as np

# English function words: pronouns, determiners, auxiliaries, prepositions, conjunctions and
# the like. They say nothing specific about a document.
STOPWORDS = frozenset("""
a about above after again against all almost also although am among an and another any anybody
anyone anything are aren around as at be became because become been before being below beside
besides between both but by can cannot could couldn did didn do does doesn doing don done down
during each either else enough etc even ever every everybody everyone everything few for from
further get gets got had hadn has hasn have haven having he her here hers herself him himself his
how however i if in into is isn it its itself just least less let like made make many may me
might mine more most much must mustn my myself neither never no nobody none nor not nothing now
of off often on once one only onto or other others otherwise our ours ourselves out over own
perhaps quite rather really same shall shan she should shouldn since so some somebody someone
something sometimes still such than that the their theirs them themselves then there therefore
these they this those though through thus to too toward towards under until up upon us very via
was wasn we were weren what whatever when whenever where wherever whether which while who
whoever whole whom whose why will with within without won would wouldn yes yet you your yours
yourself yourselves
""".split())

_WORD = re.compile(r"[a-z]+")


def words_of(text: str) -> list[str]:
  """Lower-cased alphabetic words of a text, in order (repeats kept)."""
  return _WORD.findall(text.lower())


class PublicVocabulary:
  """Word <-> id over a fixed public word list, with public Zipf frequencies.

  Attributes:
    words: tuple of V words; id = position.
    zipf: [V] float32 Zipf frequency (log10 of occurrences per billion words) of each word.
  """

  def __init__(self, words: Sequence[str], zipf: Sequence[float]):
    if len(words) != len(zipf):
      raise ValueError("words and zipf must have the same length.")
    self.words = tuple(words)
    self.zipf = np.asarray(zipf, np.float32)
    self._ids = {w: i for i, w in enumerate(self.words)}
    if len(self._ids) != len(self.words):
      raise ValueError("Vocabulary words must be distinct.")

  def __len__(self) -> int:
    return len(self.words)

  def __contains__(self, word: str) -> bool:
    return word in self._ids

  def id(self, word: str) -> int:
    """The word's id, or -1 outside V."""
    return self._ids.get(word, -1)

  def word(self, i: int) -> str:
    return self.words[i]


@functools.lru_cache(maxsize=4)
def english_vocabulary(size: int = 60000) -> PublicVocabulary:
  """V: wordfreq's `size` most frequent English words, alphabetic, >= 3 letters, no stopwords."""
  import wordfreq  # pylint: disable=g-import-not-at-top
  words = [w for w in wordfreq.top_n_list("en", size)
           if len(w) >= 3 and _WORD.fullmatch(w) and w not in STOPWORDS]
  words = list(dict.fromkeys(words))
  zipf = [wordfreq.zipf_frequency(w, "en") for w in words]
  return PublicVocabulary(words, zipf)
