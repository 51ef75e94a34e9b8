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
  (`matchers.answer_names_any`).

Split: the kept users, by increasing id, are permuted once with
`numpy.random.default_rng(seed).permutation`; position p of the permutation goes to the validation
pool if p % 10 == 0, to the test pool if p % 10 == 1, and to the database otherwise, which gives
the paper's proportions (4083 / 500 / 500 on ML-1M; ml-100k with the defaults: 674 / 85 / 85).
Asking for fewer documents or queries takes a prefix of a pool, so a small run's data is a subset
of a big run's for the same seed and folder, and no query user is ever a database user.
"""

from __future__ import annotations

import os
import re
from typing import Sequence

import numpy as np

from dpsynrag_jax.data.counts import check_count
from dpsynrag_jax.data import matchers
from dpsynrag_jax.data.matchers import display_title
from dpsynrag_jax.data.tasks import Task, TaskQuery
from dpsynrag_jax.data.movielens_files import (GENRES, LAYOUT_FILES, Movie, MovieLensError,
                                               User, detect_layout, read_movies, read_ratings,
                                               read_users)

QUESTION_SUFFIX = ("What movie is recommended for this user? "
                   "Answer with movies released in the 20th century.")

# Positions p % POOL_PERIOD of the permuted users: 0 -> validation, 1 -> test, others database.
POOL_PERIOD = 10

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

# ---------------------------------------------------------------- text templates


def _article(phrase: str) -> str:
  """ "an" before a vowel sound ("an 18-year-old", "an 8-year-old"), else "a"."""
  digits = re.match(r"\d+", phrase)
  if digits:
    n = digits.group(0)
    return "an" if n.startswith("8") or n in ("11", "18") else "a"
  return "an" if phrase[:1].lower() in "aeiou" else "a"


def profile_sentence(subject: str, user: User) -> str:
  """ "<subject> is a 24-year-old male technician." """
  gender = "male" if user.gender == "M" else "female"
  return f"{subject} is {_article(user.age)} {user.age} {gender} {user.occupation}."


def _pronoun(user: User) -> str:
  return "He" if user.gender == "M" else "She"


def preference_sentence(user: User, liked: Sequence[Movie]) -> str:
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


def user_document(name: str, user: User, liked: Sequence[Movie]) -> str:
  """The database document of one user (module docstring has the template)."""
  titles = _join([display_title(m.title) for m in liked])
  return (f"{profile_sentence(name, user)} {preference_sentence(user, liked)} "
          f"In particular, {_pronoun(user).lower()} likes {titles}.")


def user_question(user: User, liked: Sequence[Movie]) -> str:
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


def catalogue_titles(path: str | os.PathLike) -> list[str]:
  """Every film of the folder's movie file (u.item / movies.dat) as documents print it
  (display_title), in movie-id order, without repeats. The catalogue is public: it lists every
  film whatever was rated, unlike the top movies, which are counted over the ratings."""
  path = os.fspath(path)
  layout = detect_layout(path)
  movie_file = "u.item" if layout == "ml-100k" else "movies.dat"
  movies = read_movies(os.path.join(path, movie_file), layout)
  return list(dict.fromkeys(display_title(movies[m].title) for m in sorted(movies)))


def load_movielens(path: str | os.PathLike, *, num_documents: int | None = None,
                   num_validation: int | None = None, num_test: int | None = None,
                   seed: int = 0, top_movies: int = 30, favourites: int = 10,
                   min_rated: int = 5) -> Task:
  """The first `num_*` items of each pool for `seed` (None: the whole pool), from the ml-100k or
  ml-1m folder `path`. Raises MovieLensError for a missing folder or file, an unknown layout or a
  malformed line (naming the file and line).

  Document i is database user i's profile; doc_answers[i] their favourites (display titles),
  doc_subjects[i] their pseudonym (the private identifier, for the leakage metric) and
  doc_sources[i] their user id. A query's subject is its held-out user's pseudonym (never in
  its text), its source their user id. `answer_names` lists the display titles of the top
  movies, most rated first; it is computed from every rating, so it is for evaluation and
  reports, not a public input of the private pipeline. provenance["layout"] is the layout read.
  """
  for name, value in (("top_movies", top_movies), ("favourites", favourites),
                      ("min_rated", min_rated)):
    _check_positive(name, value)
  layout = detect_layout(path)
  ratings_file, users_file, movies_file = (os.path.join(os.fspath(path), f)
                                           for f in LAYOUT_FILES[layout])
  users = read_users(users_file, layout)
  movies = read_movies(movies_file, layout)
  ratings = read_ratings(ratings_file, layout, users, movies)

  top = top_movie_ids(ratings, top_movies)
  # min_rated counts every rated top movie, so read them all before cutting to `favourites`.
  rated = favourite_ids(ratings, top, top_movies)
  kept = {uid: mids[:favourites] for uid, mids in rated.items() if len(mids) >= min_rated}
  names = pseudonyms([(u.user_id, u.gender) for u in users.values()])
  database, validation, test = split_users(list(kept), seed)
  database = database[:check_count("num_documents", num_documents, len(database))]
  validation = validation[:check_count("num_validation", num_validation, len(validation))]
  test = test[:check_count("num_test", num_test, len(test))]

  def liked(uid: int) -> list[Movie]:
    return [movies[m] for m in kept[uid]]

  def favourite_titles(uid: int) -> tuple[str, ...]:
    return tuple(display_title(m.title) for m in liked(uid))

  def queries(ids: list[int]) -> tuple[TaskQuery, ...]:
    return tuple(TaskQuery(text=user_question(users[u], liked(u)), answers=favourite_titles(u),
                           subject=names[u], source=u) for u in ids)

  return Task(
      "movielens", tuple(user_document(names[u], users[u], liked(u)) for u in database),
      tuple(sorted({names[u] for u in database})), queries(validation), queries(test),
      matchers.answer_names_any, "movielens", 15,
      doc_answers=tuple(favourite_titles(u) for u in database),
      doc_subjects=tuple(names[u] for u in database), doc_sources=tuple(database),
      answer_names=tuple(display_title(movies[m].title) for m in top), seed=int(seed),
      provenance={"layout": layout})
