"""Whether an answer names a gold answer: the matchers of the three tasks, side by side.

  medical    contains_any          the gold disease name appears, ignoring case
  movielens  answer_names_any      any favourite movie is named (title variants, whole words,
                                   not a sequel, a one-word title only when it stands alone)
  searchqa   answer_contains_any   the gold answer appears as whole words, ignoring case and
                                   runs of whitespace
"""

from __future__ import annotations

import re
import unicodedata
from typing import Sequence


def contains_any(text: str, answers: Sequence[str]) -> bool:
  """Whether `text` contains any of `answers`, ignoring case (Medical Synth's rule)."""
  low = text.lower()
  return any(a.lower() in low for a in answers)


def collapse_whitespace(text: str) -> str:
  """Runs of whitespace as one space, trimmed."""
  return " ".join(text.split())


def answer_contains_any(answer: str, gold: Sequence[str]) -> bool:
  """Whether `answer` contains any of `gold` as whole words (no letter or digit right before
  or after it), ignoring case and runs of whitespace (SearchQA). Whole words, because gold
  answers as short as "C", "5" or "ex" are contained in almost any text."""
  folded = collapse_whitespace(answer).casefold()
  return any(g and re.search(r"(?<!\w)" + re.escape(collapse_whitespace(g).casefold()) + r"(?!\w)",
                             folded) for g in gold)


def answer_contains_any_substring(answer: str, gold: Sequence[str]) -> bool:
  """Whether `answer` contains any of `gold` anywhere, ignoring case and runs of whitespace:
  SearchQA's rule for keeping a question (an answer-bearing snippet), fixed before scoring
  moved to whole words so that the dataset and its builds stay the same."""
  folded = collapse_whitespace(answer).casefold()
  return any(g and collapse_whitespace(g).casefold() in folded for g in gold)


# ---------------------------------------------------------------- movie titles

# Articles that MovieLens moves to the end of a title ("Godfather, The", "Postino, Il").
_ARTICLES = ("The", "A", "An", "Il", "La", "Le", "Les", "L'", "Das", "Der", "Die", "El", "Los",
             "Las", "Det", "Den", "O")
_YEAR = re.compile(r"\s*\((\d{4})\)\s*$")
_TRAILING_PAREN = re.compile(r"^(.*\S)\s*\(([^()]+)\)$")
_TRAILING_ARTICLE = re.compile(r"^(.*\S),\s*(" + "|".join(re.escape(a) for a in _ARTICLES)
                               + r")$")
# "Star Wars: Episode IV - A New Hope": series and subtitle.
_EPISODE = re.compile(r"^(.+?):\s*Episode\s+[IVXLC]+\s+-\s+(.+)$")
# A match followed by one of these names a sequel, not the favourite ("The Godfather Part II").
_SEQUEL_MARKERS = frozenset({"part", "ii", "iii", "2", "3"})


def _split_year(title: str) -> tuple[str, str]:
  """("Godfather, The", "1972") from "Godfather, The (1972)"; ("x", "") without a year."""
  m = _YEAR.search(title)
  if m is None:
    return title.strip(), ""
  return title[:m.start()].strip(), m.group(1)


def _article_first(name: str) -> str:
  """ "Godfather, The" -> "The Godfather"; "Ennui, L'" -> "L'Ennui"; other names unchanged."""
  m = _TRAILING_ARTICLE.match(name)
  if m is None:
    return name
  article = m.group(2)
  return f"{article}{m.group(1)}" if article.endswith("'") else f"{article} {m.group(1)}"


def _article_last(name: str) -> str:
  """ "The Godfather" -> "Godfather, The" (MovieLens' own form); other names unchanged."""
  for article in _ARTICLES:
    sep = "" if article.endswith("'") else " "
    if name.startswith(article + sep) and len(name) > len(article + sep):
      return f"{name[len(article + sep):]}, {article}"
  return name


def _split_aka(name: str) -> tuple[str, str]:
  """ "Seven (Se7en)" -> ("Seven", "Se7en"); "(a.k.a. X)" gives "X"; ("name", "") without."""
  m = _TRAILING_PAREN.match(name)
  if m is None:
    return name, ""
  aka = re.sub(r"^a\.k\.a\.\s*", "", m.group(2).strip(), flags=re.IGNORECASE)
  return m.group(1).strip(), aka


def display_title(title: str) -> str:
  """The title as documents print it: leading article, alternative title and year kept.

  "Godfather, The (1972)" -> "The Godfather (1972)"; "Seventh Seal, The (Sjunde inseglet, Det)
  (1957)" -> "The Seventh Seal (Det Sjunde inseglet) (1957)".
  """
  name, year = _split_year(title)
  main, aka = _split_aka(name)
  shown = _article_first(main)
  if aka:
    shown += f" ({_article_first(aka)})"
  return f"{shown} ({year})" if year else shown


def title_variants(title: str) -> list[str]:
  """Names that count as naming the movie `title` (a MovieLens or a display title).

  The title itself, without the year, with a trailing article moved to the front (a leading one
  to the back, so that display titles give MovieLens' form too), and the main and alternative
  titles of "Main (Alternative)" alone: "Godfather, The (1972)" gives ["Godfather, The (1972)",
  "Godfather, The", "The Godfather"]. ML-1M's "Star Wars: Episode IV - A New Hope" also gives
  "A New Hope" and "Star Wars: A New Hope", never "Star Wars" alone (that would name all three
  episodes). An article is never dropped, so "The Rock" does not become the common word "Rock".
  """
  name, _ = _split_year(title)
  main, aka = _split_aka(name)
  candidates = [title.strip(), name, _article_first(name), main, _article_first(main),
                _article_last(main)]
  if aka:
    candidates += [aka, _article_first(aka), _article_last(aka)]
  episode = _EPISODE.match(main)
  if episode:
    candidates += [episode.group(2), f"{episode.group(1)}: {episode.group(2)}"]
  seen, variants = set(), []
  for c in candidates:
    if c and c not in seen and _words(c):
      seen.add(c)
      variants.append(c)
  return variants


def _plain(text: str) -> str:
  """Accents dropped (models often write "Cite" for "Cité") and "&" read as "and"."""
  text = unicodedata.normalize("NFKD", text)
  return "".join(ch for ch in text if not unicodedata.combining(ch)).replace("&", " and ")


def _words(text: str) -> list[str]:
  """The words of `text`, case kept; every non-alphanumeric is a word break."""
  return re.findall(r"[^\W_]+", _plain(text))


def _capitalised(word: str) -> bool:
  return word[:1].isupper()


def _stands_alone(text: str, spans: list[re.Match], i: int) -> bool:
  """Whether word i is capitalised (or a number) and not joined by a space to a capitalised
  neighbour."""
  word = spans[i].group(0)
  if not (_capitalised(word) or word[0].isdigit()):
    return False
  for j in (i - 1, i + 1):
    if 0 <= j < len(spans):
      left, right = sorted((spans[i], spans[j]), key=lambda m: m.start())
      if text[left.end():right.start()].isspace() and _capitalised(spans[j].group(0)):
        return False
  return True


def _names_variant(answer: str, variant: list[str]) -> bool:
  """Whether the answer's words hold the variant's words (case-insensitive) as a run that is not
  followed by a sequel marker.

  A one-word variant must also be capitalised in the answer, so that "please contact" does not
  name "Contact (1997)", and must not be joined by a space to a capitalised neighbour, so that
  "Star Trek: First Contact" does not name it either.
  """
  text = _plain(answer)
  spans = list(re.finditer(r"[^\W_]+", text))
  folded = [m.group(0).casefold() for m in spans]
  target = [w.casefold() for w in variant]
  size = len(target)
  for i in range(len(folded) - size + 1):
    if folded[i:i + size] != target:
      continue
    if i + size < len(folded) and folded[i + size] in _SEQUEL_MARKERS:
      continue
    if size == 1 and not _stands_alone(text, spans, i):
      continue
    return True
  return False


def answer_names_any(answer: str, favourites: Sequence[str]) -> bool:
  """Whether `answer` names any of `favourites` (MovieLens or display titles).

  Case, accents and punctuation are ignored; a variant (see `title_variants`) must appear as whole
  words ("Alien" is not in "Aliens") and not be followed by "Part", "II", "III", "2" or "3" (a
  sequel is another movie). A one-word variant must start with a capital letter and not sit in a
  longer capitalised name ("First Contact"), at the price of missing "Watch Contact".
  """
  return any(_names_variant(answer, _words(variant))
             for title in favourites for variant in title_variants(title))
