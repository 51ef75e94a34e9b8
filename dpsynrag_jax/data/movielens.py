"""MovieLens user profiles as private documents, and movie-recommendation queries.

GroupLens' terms forbid redistributing MovieLens, so nothing of it ships with this package: the
loader reads a folder the user names, in either layout of the official archives:

    ml-100k   u.data (tab: user, movie, rating, timestamp), u.user (user|age|gender|occupation|zip),
              u.item (movie|title|release date|video date|URL|19 genre flags); latin-1
    ml-1m     ratings.dat (user::movie::rating::timestamp), users.dat
              (user::gender::age code::occupation code::zip), movies.dat (movie::title::genres);
              latin-1
    (a folder holding both is read as ml-100k)

What is built (following the paper, with the rules it leaves open stated here):

- Top movies: the `top_movies` (30) movies with the most ratings over ALL users; ties in the
  count go to the smaller movie id.
- A user's favourites: their rated top movies sorted by rating (highest first), then timestamp
  (earliest first), then movie id; the first `favourites` (10) of them. Users with fewer than
  `min_rated` (default 5) rated top movies are dropped; a kept user with fewer than `favourites`
  rated top movies has that many favourites. The paper keeps 4083 + 1000 of ML-1M's 6040 users
  (84 %) and does not say how; a threshold of 10 would keep only 60 % of ml-100k's users, 5 keeps
  89 %.
- Pseudonyms: ml-100k and ml-1m have no names. Every user in the users file gets an invented full
  name, first name matching the gender, from the lists below: users of one gender, by increasing
  id, take the combinations (first, last) in a fixed shuffled order. The name depends only on the
  users file (not on the seed or the split), no two users share one, and it is the private
  identifier that the leakage metric looks for.
- Preference sentence: the paper asked an LLM for one sentence without titles, starting with
  He/She. Ours is a template over the genres of the favourites: "He mostly enjoys drama, comedy
  and thriller movies." with up to three genres, most frequent first, ties in the order of
  `GENRES`; "unknown" is never named.
- Document: "<name> is a <age>-year-old <gender> <occupation>. <preference> In particular, he
  likes <favourite 1>, <favourite 2>, ... and <favourite n>." Titles are shown with a leading
  article ("The Godfather (1972)", see `display_title`); occupations are written as noun phrases
  ("healthcare worker" for ml-100k's "healthcare"); ml-1m's age codes are written as the paper's
  example does ("35-year-old" for the 35-44 bucket) except code 1, "teenage".
- Query: the same profile about "This user" instead of the name, the preference sentence, then
  "What movie is recommended for this user? Answer with movies released in the 20th century."
  The gold answers are that user's favourites; an answer counts if it names any of them
  (`answer_names_any`).

Split: the kept users, by increasing id, are permuted once with
`numpy.random.default_rng(seed).permutation`; position p of the permutation goes to the validation
pool if p % 10 == 0, to the test pool if p % 10 == 1, and to the database otherwise, which gives
the paper's proportions (4083 / 500 / 500 on ML-1M; ml-100k with the defaults: 674 / 85 / 85).
Asking for fewer documents or queries takes a prefix of a pool, so a small run's data is a subset
of a big run's for the same seed and folder, and no query user is ever a database user.
"""

from __future__ import annotations

import dataclasses
import os
import re
import unicodedata
from typing import Iterator, Sequence

import numpy as np

from dpsynrag_jax.data.counts import check_count

QUESTION_SUFFIX = ("What movie is recommended for this user? "
                   "Answer with movies released in the 20th century.")

# Positions p % POOL_PERIOD of the permuted users: 0 -> validation, 1 -> test, others database.
POOL_PERIOD = 10

# The genre flags of u.item in file order (u.genre lists the same); ml-1m names 18 of them.
GENRES = ("unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime",
          "Documentary", "Drama", "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery",
          "Romance", "Sci-Fi", "Thriller", "War", "Western")

LAYOUT_FILES = {
    "ml-100k": ("u.data", "u.user", "u.item"),
    "ml-1m": ("ratings.dat", "users.dat", "movies.dat"),
}

# ml-100k occupations that do not read as a noun after "a 30-year-old male".
_OCCUPATIONS_100K = {
    "entertainment": "entertainment worker",
    "healthcare": "healthcare worker",
    "marketing": "marketing professional",
    "none": "person with no occupation",
    "other": "person with an unlisted occupation",
    "retired": "retiree",
}

# ml-1m occupation codes (its README), as noun phrases; 4 follows the paper's "college student".
_OCCUPATIONS_1M = (
    "person with an unlisted occupation", "educator", "artist", "clerical worker",
    "college student", "customer service worker", "healthcare worker", "executive", "farmer",
    "homemaker", "school student", "lawyer", "programmer", "retiree", "salesperson", "scientist",
    "self-employed worker", "engineer", "tradesperson", "unemployed person", "writer")

# ml-1m age codes: the lower end of each bucket, except "Under 18".
_AGES_1M = {1: "teenage", 18: "18-year-old", 25: "25-year-old", 35: "35-year-old",
            45: "45-year-old", 50: "50-year-old", 56: "56-year-old"}

# Invented names: common given names and surnames, combined at random; 70 x 100 = 7000 per gender
# (ML-1M has 4331 men). Surnames that are also common English words are left out so that a name
# in a model's output is a name, not a phrase.
_FIRST_MALE = (
    "Aaron", "Adrian", "Alan", "Albert", "Alec", "Andrew", "Arthur", "Benjamin", "Bernard",
    "Brandon", "Bruce", "Calvin", "Cameron", "Carl", "Cedric", "Charles", "Clifford", "Colin",
    "Conrad", "Daniel", "Darren", "David", "Dennis", "Derek", "Dominic", "Donald", "Douglas",
    "Edgar", "Edward", "Elliot", "Eric", "Felix", "Francis", "Gareth", "Gerald", "Gordon",
    "Graham", "Gregory", "Harold", "Howard", "Ian", "Jacob", "Jeffrey", "Jeremy", "Jonathan",
    "Julian", "Keith", "Kenneth", "Kevin", "Lawrence", "Leonard", "Lucas", "Malcolm", "Martin",
    "Nathan", "Neil", "Oliver", "Oscar", "Patrick", "Philip", "Raymond", "Roland", "Samuel",
    "Simon", "Stanley", "Stephen", "Theodore", "Timothy", "Victor", "Walter")
_FIRST_FEMALE = (
    "Abigail", "Adele", "Alice", "Alison", "Amanda", "Angela", "Barbara", "Beatrice", "Brenda",
    "Bridget", "Camille", "Carla", "Caroline", "Cecilia", "Charlotte", "Claire", "Cynthia",
    "Daphne", "Deborah", "Denise", "Diana", "Dorothy", "Eleanor", "Elaine", "Eliza", "Emily",
    "Fiona", "Florence", "Gemma", "Georgia", "Gloria", "Hannah", "Harriet", "Helena", "Imogen",
    "Irene", "Isabel", "Janet", "Jessica", "Joanna", "Judith", "Julia", "Karen", "Laura",
    "Lillian", "Linda", "Lorraine", "Lucy", "Lydia", "Margaret", "Marian", "Martha", "Melanie",
    "Miriam", "Monica", "Nadia", "Natalie", "Nora", "Olivia", "Pamela", "Patricia", "Priscilla",
    "Rachel", "Rebecca", "Sabrina", "Sandra", "Sophia", "Theresa", "Valerie", "Vivian")
_LAST = (
    "Abernathy", "Ackerley", "Ainsworth", "Aldridge", "Ashcombe", "Babcock", "Bancroft",
    "Barrowman", "Beaumont", "Blackwood", "Bradshaw", "Brannigan", "Calloway", "Carrington",
    "Castellano", "Chadwick", "Chatterton", "Cunningham", "Dalrymple", "Delacroix", "Donnelly",
    "Drummond", "Dunleavy", "Eastbrook", "Ellingham", "Etherington", "Fairbanks", "Farnsworth",
    "Fenwick", "Fitzgerald", "Gallagher", "Garrity", "Gilchrist", "Goldberg", "Greenhalgh",
    "Hadley", "Halloran", "Hargreaves", "Hathaway", "Hollister", "Huxley", "Ingleby", "Jablonski",
    "Kavanagh", "Kettering", "Kowalski", "Lachance", "Langford", "Lindqvist", "Lockhart",
    "Lowenthal", "Macaulay", "Mandeville", "Marchetti", "McAllister", "Merriweather", "Montague",
    "Moriarty", "Nakamura", "Northcott", "Oyelaran", "Pemberton", "Pendleton", "Quigley",
    "Radcliffe", "Rasmussen", "Ravensworth", "Rosenblatt", "Rutherford", "Santangelo",
    "Sedgewick", "Sheffield", "Silverman", "Sinclair", "Southgate", "Stanhope", "Strickland",
    "Sutherland", "Takahashi", "Thackeray", "Thornbury", "Treadwell", "Underhill", "Vandermeer",
    "Vasquez", "Wainwright", "Walcott", "Wetherby", "Whitcombe", "Wilberforce", "Winterbourne",
    "Woodhouse", "Worthington", "Yarborough", "Yoshida", "Zabriskie", "Zeller", "Zimmerman",
    "Zielinski", "Zorrilla")
_NAME_SEED = 20251008

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


class MovieLensError(ValueError):
  """The MovieLens folder is missing, of an unknown layout, or a file breaks its format."""


@dataclasses.dataclass(frozen=True)
class MovieQuery:
  """One question: `text` goes to the RAG system, `answers` (the user's favourites, display
  titles) to the metric only; `user` is the held-out user's pseudonym, never in the text."""
  text: str
  answers: list[str]
  user: str
  user_id: int


@dataclasses.dataclass(frozen=True)
class MovieLens:
  """A seeded split of MovieLens (module docstring has every rule).

  documents[i], doc_users[i], doc_user_ids[i] and doc_favourites[i] describe database user i.
  Only `documents` is private input to the pipeline; `doc_users` (the pseudonyms, the private
  identifiers) serves the leakage metric and `doc_favourites` is gold data. `movies` lists the
  display titles of the top movies, most rated first; it is computed from every rating, so it is
  for evaluation and reports, not a public input of the private pipeline.
  """
  documents: list[str]
  doc_users: list[str]
  doc_user_ids: list[int]
  doc_favourites: list[list[str]]
  validation: list[MovieQuery]
  test: list[MovieQuery]
  movies: list[str]
  layout: str
  seed: int


@dataclasses.dataclass(frozen=True)
class _User:
  user_id: int
  age: str          # the "<n>-year-old" phrase
  gender: str       # "M" or "F"
  occupation: str   # noun phrase


@dataclasses.dataclass(frozen=True)
class _Movie:
  movie_id: int
  title: str                # as in the file
  genres: tuple[str, ...]   # names from GENRES


# ---------------------------------------------------------------- titles and matching


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


# ---------------------------------------------------------------- text templates


def _article(phrase: str) -> str:
  """ "an" before a vowel sound ("an 18-year-old", "an 8-year-old"), else "a"."""
  digits = re.match(r"\d+", phrase)
  if digits:
    n = digits.group(0)
    return "an" if n.startswith("8") or n in ("11", "18") else "a"
  return "an" if phrase[:1].lower() in "aeiou" else "a"


def profile_sentence(subject: str, user: _User) -> str:
  """ "<subject> is a 24-year-old male technician." """
  gender = "male" if user.gender == "M" else "female"
  return f"{subject} is {_article(user.age)} {user.age} {gender} {user.occupation}."


def _pronoun(user: _User) -> str:
  return "He" if user.gender == "M" else "She"


def preference_sentence(user: _User, liked: Sequence[_Movie]) -> str:
  """ "He mostly enjoys drama, comedy and thriller movies." from the genres of `liked`."""
  counts: dict[str, int] = {}
  for movie in liked:
    for genre in movie.genres:
      if genre != "unknown":
        counts[genre] = counts.get(genre, 0) + 1
  top = sorted(counts, key=lambda g: (-counts[g], GENRES.index(g)))[:3]
  if not top:
    return f"{_pronoun(user)} enjoys all kinds of movies."
  return f"{_pronoun(user)} mostly enjoys {_join([g.lower() for g in top])} movies."


def _join(items: Sequence[str]) -> str:
  """ "a", "a and b", "a, b and c"."""
  if len(items) <= 1:
    return "".join(items)
  return f"{', '.join(items[:-1])} and {items[-1]}"


def user_document(name: str, user: _User, liked: Sequence[_Movie]) -> str:
  """The database document of one user (module docstring has the template)."""
  titles = _join([display_title(m.title) for m in liked])
  return (f"{profile_sentence(name, user)} {preference_sentence(user, liked)} "
          f"In particular, {_pronoun(user).lower()} likes {titles}.")


def user_question(user: _User, liked: Sequence[_Movie]) -> str:
  """A query about a held-out user: profile, preference, then `QUESTION_SUFFIX`."""
  return (f"{profile_sentence('This user', user)} {preference_sentence(user, liked)} "
          f"{QUESTION_SUFFIX}")


# ---------------------------------------------------------------- pseudonyms


def pseudonyms(users: Sequence[tuple[int, str]]) -> dict[int, str]:
  """user id -> invented full name, for (user id, gender "M"/"F") pairs (module docstring)."""
  names = {}
  for gender, firsts, salt in (("M", _FIRST_MALE, 0), ("F", _FIRST_FEMALE, 1)):
    ids = sorted(uid for uid, g in users if g == gender)
    capacity = len(firsts) * len(_LAST)
    if len(ids) > capacity:
      raise MovieLensError(f"{len(ids)} users of gender {gender}, but only {capacity} distinct "
                           "pseudonyms exist; extend the name lists in movielens.py.")
    order = np.random.default_rng([_NAME_SEED, salt]).permutation(capacity)
    for rank, uid in enumerate(ids):
      first, last = divmod(int(order[rank]), len(_LAST))
      names[uid] = f"{firsts[first]} {_LAST[last]}"
  return names


# ---------------------------------------------------------------- reading the files


def detect_layout(path: str | os.PathLike) -> str:
  """ "ml-100k" or "ml-1m", from which files the folder holds."""
  path = os.fspath(path)
  if not os.path.isdir(path):
    raise MovieLensError(f"MovieLens folder {path} does not exist or is not a folder.")
  for layout, files in LAYOUT_FILES.items():
    present = [f for f in files if os.path.exists(os.path.join(path, f))]
    if len(present) == len(files):
      return layout
    if present:
      missing = sorted(set(files) - set(present))
      raise MovieLensError(f"{path} looks like the {layout} layout (it has {', '.join(present)}) "
                           f"but lacks {', '.join(missing)}.")
  expected = "; ".join(f"{k}: {', '.join(v)}" for k, v in LAYOUT_FILES.items())
  raise MovieLensError(f"{path} holds no MovieLens files; expected one of the layouts {expected}.")


def _records(path: str, sep: str, fields: Sequence[str]) -> Iterator[tuple[int, list[str]]]:
  """(1-based line number, fields) for every non-blank line, checking the field count."""
  with open(path, encoding="latin-1", newline="") as f:
    for n, line in enumerate(f, start=1):
      line = line.rstrip("\r\n")
      if not line.strip():
        continue
      parts = line.split(sep)
      if len(parts) != len(fields):
        raise MovieLensError(f"{path}, line {n}: expected {len(fields)} fields separated by "
                             f"{sep!r} ({', '.join(fields)}), got {len(parts)}.")
      yield n, parts


def _int(path: str, n: int, name: str, value: str) -> int:
  try:
    return int(value)
  except ValueError:
    raise MovieLensError(f"{path}, line {n}: {name} must be an integer, got {value!r}.") from None


def _gender(path: str, n: int, value: str) -> str:
  if value not in ("M", "F"):
    raise MovieLensError(f"{path}, line {n}: gender must be M or F, got {value!r}.")
  return value


def _read_users(path: str, layout: str) -> dict[int, _User]:
  users = {}
  if layout == "ml-100k":
    rows = _records(path, "|", ("user", "age", "gender", "occupation", "zip"))
  else:
    rows = _records(path, "::", ("user", "gender", "age", "occupation", "zip"))
  for n, parts in rows:
    uid = _int(path, n, "user id", parts[0])
    if layout == "ml-100k":
      age = f"{_int(path, n, 'age', parts[1])}-year-old"
      gender = _gender(path, n, parts[2])
      occupation = _OCCUPATIONS_100K.get(parts[3].strip(), parts[3].strip())
    else:
      gender = _gender(path, n, parts[1])
      code = _int(path, n, "age", parts[2])
      if code not in _AGES_1M:
        raise MovieLensError(f"{path}, line {n}: age code must be one of {sorted(_AGES_1M)}, "
                             f"got {code}.")
      age = _AGES_1M[code]
      occ = _int(path, n, "occupation", parts[3])
      if not 0 <= occ < len(_OCCUPATIONS_1M):
        raise MovieLensError(f"{path}, line {n}: occupation code must be in [0, "
                             f"{len(_OCCUPATIONS_1M) - 1}], got {occ}.")
      occupation = _OCCUPATIONS_1M[occ]
    if not occupation:
      raise MovieLensError(f"{path}, line {n}: empty occupation.")
    if uid in users:
      raise MovieLensError(f"{path}, line {n}: user {uid} appears twice.")
    users[uid] = _User(user_id=uid, age=age, gender=gender, occupation=occupation)
  if not users:
    raise MovieLensError(f"{path} lists no users.")
  return users


def _read_movies(path: str, layout: str) -> dict[int, _Movie]:
  movies = {}
  if layout == "ml-100k":
    names = ("movie", "title", "release date", "video release date", "URL") + tuple(
        f"{g} flag" for g in GENRES)
    rows = _records(path, "|", names)
  else:
    rows = _records(path, "::", ("movie", "title", "genres"))
  for n, parts in rows:
    mid = _int(path, n, "movie id", parts[0])
    if layout == "ml-100k":
      flags = parts[5:]
      if any(f not in ("0", "1") for f in flags):
        raise MovieLensError(f"{path}, line {n}: genre flags must be 0 or 1.")
      genres = tuple(g for g, f in zip(GENRES, flags) if f == "1")
    else:
      genres = tuple(g for g in parts[2].split("|") if g)
      unknown = [g for g in genres if g not in GENRES]
      if unknown:
        raise MovieLensError(f"{path}, line {n}: unknown genre {unknown[0]!r}; known: "
                             f"{', '.join(GENRES)}.")
    if not parts[1].strip():
      raise MovieLensError(f"{path}, line {n}: empty title.")
    if mid in movies:
      raise MovieLensError(f"{path}, line {n}: movie {mid} appears twice.")
    movies[mid] = _Movie(movie_id=mid, title=parts[1].strip(), genres=genres)
  if not movies:
    raise MovieLensError(f"{path} lists no movies.")
  return movies


def _read_ratings(path: str, layout: str, users: dict[int, _User],
                  movies: dict[int, _Movie]) -> np.ndarray:
  """int64 array (n, 4): user, movie, rating, timestamp."""
  sep = "\t" if layout == "ml-100k" else "::"
  rows = []
  seen: dict[tuple[int, int], int] = {}
  for n, parts in _records(path, sep, ("user", "movie", "rating", "timestamp")):
    uid, mid, rating, stamp = (_int(path, n, name, v) for name, v in
                               zip(("user id", "movie id", "rating", "timestamp"), parts))
    if uid not in users:
      raise MovieLensError(f"{path}, line {n}: user {uid} is not in the users file.")
    if mid not in movies:
      raise MovieLensError(f"{path}, line {n}: movie {mid} is not in the movies file.")
    if not 1 <= rating <= 5:
      raise MovieLensError(f"{path}, line {n}: rating must be in [1, 5], got {rating}.")
    if (uid, mid) in seen:
      raise MovieLensError(f"{path}, line {n}: user {uid} rated movie {mid} already on line "
                           f"{seen[(uid, mid)]}.")
    seen[(uid, mid)] = n
    rows.append((uid, mid, rating, stamp))
  if not rows:
    raise MovieLensError(f"{path} holds no ratings.")
  return np.asarray(rows, dtype=np.int64)


# ---------------------------------------------------------------- selection and split


def top_movie_ids(ratings: np.ndarray, count: int) -> list[int]:
  """The `count` most-rated movie ids, most rated first, ties to the smaller id."""
  ids, counts = np.unique(ratings[:, 1], return_counts=True)
  if len(ids) < count:
    raise MovieLensError(f"Only {len(ids)} movies have ratings; top_movies={count} needs more.")
  order = np.lexsort((ids, -counts))
  return [int(i) for i in ids[order[:count]]]


def favourite_ids(ratings: np.ndarray, top: Sequence[int], favourites: int) -> dict[int, list[int]]:
  """user id -> their rated top movies in favourite order (rating desc, timestamp asc, movie id
  asc), cut to `favourites`; only users with at least one rated top movie appear."""
  mask = np.isin(ratings[:, 1], np.asarray(top))
  r = ratings[mask]
  order = np.lexsort((r[:, 1], r[:, 3], -r[:, 2], r[:, 0]))
  result: dict[int, list[int]] = {}
  for uid, mid in r[order][:, :2]:
    result.setdefault(int(uid), []).append(int(mid))
  return {uid: mids[:favourites] for uid, mids in result.items()}


def split_users(user_ids: Sequence[int], seed: int) -> tuple[list[int], list[int], list[int]]:
  """The seeded database, validation and test pools (module docstring)."""
  ordered = sorted(user_ids)
  perm = np.random.default_rng(seed).permutation(len(ordered))
  database, validation, test = [], [], []
  for position, index in enumerate(perm):
    pool = {0: validation, 1: test}.get(position % POOL_PERIOD, database)
    pool.append(ordered[int(index)])
  return database, validation, test


def _check_positive(name: str, value: int) -> None:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
    raise ValueError(f"{name} must be a positive int, got {value!r}.")


def load_movielens(path: str | os.PathLike, *, num_documents: int | None = None,
                   num_validation: int | None = None, num_test: int | None = None,
                   seed: int = 0, top_movies: int = 30, favourites: int = 10,
                   min_rated: int = 5) -> MovieLens:
  """The first `num_*` items of each pool for `seed` (None: the whole pool), from the ml-100k or
  ml-1m folder `path`. Raises MovieLensError for a missing folder or file, an unknown layout or a
  malformed line (naming the file and line)."""
  for name, value in (("top_movies", top_movies), ("favourites", favourites),
                      ("min_rated", min_rated)):
    _check_positive(name, value)
  layout = detect_layout(path)
  ratings_file, users_file, movies_file = (os.path.join(os.fspath(path), f)
                                           for f in LAYOUT_FILES[layout])
  users = _read_users(users_file, layout)
  movies = _read_movies(movies_file, layout)
  ratings = _read_ratings(ratings_file, layout, users, movies)

  top = top_movie_ids(ratings, top_movies)
  # min_rated counts every rated top movie, so read them all before cutting to `favourites`.
  rated = favourite_ids(ratings, top, top_movies)
  kept = {uid: mids[:favourites] for uid, mids in rated.items() if len(mids) >= min_rated}
  names = pseudonyms([(u.user_id, u.gender) for u in users.values()])
  database, validation, test = split_users(list(kept), seed)
  database = database[:check_count("num_documents", num_documents, len(database))]
  validation = validation[:check_count("num_validation", num_validation, len(validation))]
  test = test[:check_count("num_test", num_test, len(test))]

  def liked(uid: int) -> list[_Movie]:
    return [movies[m] for m in kept[uid]]

  def queries(ids: list[int]) -> list[MovieQuery]:
    return [MovieQuery(text=user_question(users[u], liked(u)),
                       answers=[display_title(m.title) for m in liked(u)], user=names[u],
                       user_id=u) for u in ids]

  return MovieLens(
      documents=[user_document(names[u], users[u], liked(u)) for u in database],
      doc_users=[names[u] for u in database], doc_user_ids=list(database),
      doc_favourites=[[display_title(m.title) for m in liked(u)] for u in database],
      validation=queries(validation), test=queries(test),
      movies=[display_title(movies[m].title) for m in top], layout=layout, seed=int(seed))
