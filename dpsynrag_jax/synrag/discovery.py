"""Topic terms found in the private corpus itself, under DP (beyond the paper; off by default).

Openings-only texts need a list of the terms that matter (a disease, its symptoms); a user's own
corpus ships none. Here each document proposes at most m terms, the corpus's terms are chosen by
partition selection (privacy.partition_selection: a term is released when its noisy document
count passes a threshold), and the clusters then draw their topic terms from that released list
with the usual exponential mechanism (synrag.topics, source 'discovered').

  phrases    a document's candidate terms: inside each clause (text between punctuation marks),
             the maximal runs of words that are not function words (vocabulary.STOPWORDS), cut
             into pieces of at most max_n words. "Given the symptoms (Severe headaches, Skin
             lesions) of Ann Lee. The diagnosis is Burpitis Globulosa" -> given, symptoms,
             severe headaches, skin lesions, ann lee, diagnosis, burpitis globulosa.
  proposals  its m phrases with the rarest words, by the public Zipf frequency of each phrase's
             rarest word (a word no list knows counts as rarest), ties by the phrase: a rule that
             reads that document alone, so each document moves at most m counts by 1.
  presence   [N, V] bool: document i proposes discovered term j; a cluster's counts for the topic
             draw are presence[S_r].sum(0) (monotone, each moved by at most 1 by one document).

Why maximal runs rather than every n-gram (n <= 3): a name is a run ("burpocalypse inflammation
syndrome"), and the n-grams inside or across it ("diagnosis is burpocalypse", "inflammation")
would take the document's few proposals for pieces of the same name. Why rarest first: the words
that set a document apart (a disease, a treatment, a film) are rare in general English, while the
template words every document shares ("diagnosis", "symptoms") are common, and a term every
document proposes would be every cluster's most frequent, crowding out what tells clusters apart.

Why a unit 'names' (runs of capitalised words as candidates of their own, proposed before the
phrases): in a corpus about entities (SearchQA's snippets, whose answers are people, places and
titles) the entity a document is about is often a common word ("Paris", "the Sun"), which
rarest-first passes over for the snippet's rare incidental words. On SearchQA's validation
questions the share of answers that the partition selection is expected to release rose from
6 % (runs) to 16 % (names) at m 5, rho 1 (26 % at rho 2).
Case is read from the document alone, so the l0 bound and the guarantee are unchanged.
"""

from __future__ import annotations

import functools
import re
from typing import Sequence

import numpy as np

from dpsynrag_jax.synrag.vocabulary import STOPWORDS, PublicVocabulary

# A clause ends at any punctuation mark; words are runs of letters, digits and apostrophes.
_CLAUSE_END = re.compile(r"[^\w\s']+")
_WORD = re.compile(r"[\w']+")


UNITS = ("runs", "clauses", "names")


def clauses(text: str, max_n: int = 8) -> list[str]:
  """The document's clauses (text between punctuation marks) as candidate terms, lower-cased,
  words joined by one space, each cut into pieces of at most max_n words; the clause keeps its
  framing ("the diagnosis is flibberjibits syndrome"), which tells a reader what the term is."""
  if max_n < 1:
    raise ValueError(f"max_n must be >= 1, got {max_n}.")
  out = []
  for clause in _CLAUSE_END.split(text.lower()):
    words = [w for w in (w.strip("'") for w in _WORD.findall(clause)) if w]
    if any(w not in STOPWORDS for w in words):
      out.extend(" ".join(words[i:i + max_n]) for i in range(0, len(words), max_n))
  return out


def candidates(text: str, unit: str = "runs", max_n: int = 3) -> list[str]:
  """A document's candidate terms by `unit`: 'runs' (phrases), 'clauses', or 'names' (names,
  then phrases)."""
  if unit == "runs":
    return phrases(text, max_n)
  if unit == "names":
    return names(text, max_n) + phrases(text, max_n)
  if unit == "clauses":
    return clauses(text, max_n)
  raise ValueError(f"discovery.unit must be one of {UNITS}, got {unit!r}.")


def phrases(text: str, max_n: int = 3) -> list[str]:
  """The document's candidate terms in text order (repeats kept), lower-cased (see module doc)."""
  if max_n < 1:
    raise ValueError(f"max_n must be >= 1, got {max_n}.")
  out = []
  for clause in _CLAUSE_END.split(text.lower()):
    run: list[str] = []
    for word in _WORD.findall(clause) + [""]:   # "" closes the last run
      word = word.strip("'")
      if word and word not in STOPWORDS:
        run.append(word)
        continue
      out.extend(" ".join(run[i:i + max_n]) for i in range(0, len(run), max_n))
      run = []
  return out


def names(text: str, max_n: int = 3) -> list[str]:
  """The document's runs of capitalised words that are not function words ("Douglas MacArthur",
  "New Zealand"), in text order, lower-cased, cut into pieces of at most max_n words: the
  phrases() a unit 'names' proposes first. A sentence's capitalised first word counts too."""
  if max_n < 1:
    raise ValueError(f"max_n must be >= 1, got {max_n}.")
  out = []
  for clause in _CLAUSE_END.split(text):
    run: list[str] = []
    for word in _WORD.findall(clause) + [""]:   # "" closes the last run
      word = word.strip("'")
      if word[:1].isupper() and word.lower() not in STOPWORDS:
        run.append(word.lower())
        continue
      out.extend(" ".join(run[i:i + max_n]) for i in range(0, len(run), max_n))
      run = []
  return out


@functools.lru_cache(maxsize=200_000)
def _wordfreq_zipf(word: str) -> float:
  import wordfreq  # pylint: disable=g-import-not-at-top
  return float(wordfreq.zipf_frequency(word, "en"))


def rarity(phrase: str, vocab: PublicVocabulary) -> float:
  """The public Zipf frequency of the phrase's rarest word that is not a function word (0 for a
  word no list holds)."""
  def zipf(word):
    i = vocab.id(word)
    return float(vocab.zipf[i]) if i >= 0 else _wordfreq_zipf(word)
  words = [w for w in phrase.split() if w not in STOPWORDS] or phrase.split()
  return min(zipf(w) for w in words)


def proposals(text: str, vocab: PublicVocabulary, m: int, max_n: int = 3,
              unit: str = "runs") -> list[str]:
  """A document's at most m distinct proposed terms, rarest first (ties by the phrase); with
  unit 'names', the names() come first, rarest first among them."""
  if m < 1:
    raise ValueError(f"m (terms per document) must be >= 1, got {m}.")
  distinct = set(candidates(text, unit, max_n))
  named = set(names(text, max_n)) if unit == "names" else set()
  return sorted(distinct, key=lambda p: (p not in named, rarity(p, vocab), p))[:m]


def all_proposals(texts: Sequence[str], vocab: PublicVocabulary, m: int,
                  max_n: int = 3, unit: str = "runs") -> list[list[str]]:
  """proposals() of every document, in corpus order."""
  return [proposals(t, vocab, m, max_n, unit) for t in texts]


def vocabulary_of(discovered: Sequence[str], public: PublicVocabulary) -> PublicVocabulary:
  """The discovered terms as the keyword vocabulary V of step 1 (keywords.vocabulary =
  'discovered'), each with its rarity as its Zipf value. A DP release, so V stays independent
  of any one document, as the histogram needs."""
  if not discovered:
    raise ValueError("The term discovery released no term, so there is no keyword vocabulary: "
                     "raise privacy.rho_terms or use keywords.vocabulary='public'.")
  return PublicVocabulary(list(discovered), [rarity(t, public) for t in discovered])


def keyword_ids(document_proposals: Sequence[Sequence[str]], vocab: PublicVocabulary,
                K: int) -> np.ndarray:
  """[N, K] int32: each document's proposals that are in `vocab`, in proposal order (-1 pad)."""
  out = np.full((len(document_proposals), K), -1, np.int32)
  for i, proposed in enumerate(document_proposals):
    ids = [vocab.id(t) for t in proposed if vocab.id(t) >= 0][:K]
    out[i, :len(ids)] = ids
  return out


def presence(document_proposals: Sequence[Sequence[str]], terms: Sequence[str]) -> np.ndarray:
  """[N, V] bool: document i proposes terms[j]."""
  index = {t: j for j, t in enumerate(terms)}
  out = np.zeros((len(document_proposals), len(terms)), bool)
  for i, proposed in enumerate(document_proposals):
    for t in proposed:
      j = index.get(t)
      if j is not None:
        out[i, j] = True
  return out
