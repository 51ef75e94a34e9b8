"""Reading MovieLens' files (ml-100k and ml-1m layouts) into users, movies and ratings.

Every error names the file and line and says what was expected (data.movielens has the rules of
what is built from them). The archives are latin-1.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Iterator, Sequence

import numpy as np

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

class MovieLensError(ValueError):
  """The MovieLens folder is missing, of an unknown layout, or a file breaks its format."""


@dataclasses.dataclass(frozen=True)
class User:
  user_id: int
  age: str          # the "<n>-year-old" phrase
  gender: str       # "M" or "F"
  occupation: str   # noun phrase


@dataclasses.dataclass(frozen=True)
class Movie:
  movie_id: int
  title: str                # as in the file
  genres: tuple[str, ...]   # names from GENRES


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


def read_users(path: str, layout: str) -> dict[int, User]:
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
    users[uid] = User(user_id=uid, age=age, gender=gender, occupation=occupation)
  if not users:
    raise MovieLensError(f"{path} lists no users.")
  return users


def read_movies(path: str, layout: str) -> dict[int, Movie]:
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
    movies[mid] = Movie(movie_id=mid, title=parts[1].strip(), genres=genres)
  if not movies:
    raise MovieLensError(f"{path} lists no movies.")
  return movies


def read_ratings(path: str, layout: str, users: dict[int, User],
                  movies: dict[int, Movie]) -> np.ndarray:
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
