"""Small generated datasets in the layouts of MovieLens and SearchQA, for tests and demos.

Neither dataset may be redistributed, so tests never read a real copy: these writers invent
users, titles, genres, ratings, questions and snippets with numpy from a seed, and write them in
the files and formats the loaders read (movielens.py and searchqa.py document the layouts).
Every writer returns what it wrote, so that a test can compute the expected result on its own.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os

import numpy as np

from dpsynrag_jax.data import movielens, searchqa

# ---------------------------------------------------------------- MovieLens

_OCCUPATIONS_100K = (
    "administrator", "artist", "doctor", "educator", "engineer", "entertainment", "executive",
    "healthcare", "homemaker", "lawyer", "librarian", "marketing", "none", "other", "programmer",
    "retired", "salesman", "scientist", "student", "technician", "writer")
_AGE_CODES_1M = (1, 18, 25, 35, 45, 50, 56)
_TITLE_ADJECTIVES = ("Silent", "Crimson", "Hollow", "Distant", "Electric", "Golden", "Broken",
                     "Midnight", "Northern", "Paper", "Wandering", "Velvet", "Frozen", "Hidden")
_TITLE_NOUNS = ("Harbor", "Orchard", "Lantern", "Meridian", "Compass", "Garden", "Station",
                "Voyage", "Café", "Canyon", "Ledger", "Carousel", "Tide", "Quarry")
_FOREIGN = ("Le Jardin", "Die Reise", "La Nuit", "El Faro", "Il Sogno", "Der Spiegel",
            "La Strada", "Les Ombres", "O Barco", "Das Licht")


@dataclasses.dataclass(frozen=True)
class MovieLensFixture:
  """What `write_movielens_fixture` wrote.

  users: (id, age in years or ml-1m age code, "M"/"F", occupation name or ml-1m code).
  movies: (id, title as written, genre names). ratings: int64 (n, 4) user, movie, rating,
  timestamp, in file order.
  """
  path: str
  layout: str
  users: list[tuple[int, int, str, str | int]]
  movies: list[tuple[int, str, tuple[str, ...]]]
  ratings: np.ndarray


def _invented_titles(rng: np.random.Generator, count: int) -> list[str]:
  """Distinct MovieLens-style titles: some with a trailing ", The", some with an alternative
  title, one with a non-ASCII letter (the files are latin-1), years 1930-1999."""
  combos = [(a, n) for a in _TITLE_ADJECTIVES for n in _TITLE_NOUNS]
  if count > len(combos):
    raise ValueError(f"At most {len(combos)} fixture movies, asked for {count}.")
  picks = rng.permutation(len(combos))[:count]
  titles = []
  for i, k in enumerate(picks):
    adjective, noun = combos[int(k)]
    name = f"{adjective} {noun}"
    if i % 5 == 1:
      name += ", The"
    elif i % 7 == 3 and i // 7 < len(_FOREIGN):  # alternative titles are distinct
      name += f" ({_FOREIGN[i // 7]})"
    titles.append(f"{name} ({int(rng.integers(1930, 2000))})")
  return titles


def write_movielens_fixture(directory: str | os.PathLike, layout: str = "ml-100k",
                            num_users: int = 150, num_movies: int = 45,
                            seed: int = 0) -> MovieLensFixture:
  """Writes an invented MovieLens folder of `layout` ("ml-100k" or "ml-1m") into `directory`.

  Movies differ in popularity and users in activity, so some users rate few of the top movies
  (and are dropped by the loader); timestamps repeat, so ties in the favourite order happen.
  """
  if layout not in movielens.LAYOUT_FILES:
    raise ValueError(f"layout must be one of {sorted(movielens.LAYOUT_FILES)}, got {layout!r}.")
  directory = os.fspath(directory)
  os.makedirs(directory, exist_ok=True)
  rng = np.random.default_rng(seed)
  named_genres = movielens.GENRES[1:]

  movies = []
  for mid, title in enumerate(_invented_titles(rng, num_movies), start=1):
    picks = rng.choice(len(named_genres), size=int(rng.integers(1, 4)), replace=False)
    movies.append((mid, title, tuple(named_genres[int(k)] for k in sorted(picks))))

  users = []
  for uid in range(1, num_users + 1):
    gender = "M" if rng.random() < 0.65 else "F"
    if layout == "ml-100k":
      age = int(rng.integers(8, 74))
      occupation: str | int = _OCCUPATIONS_100K[int(rng.integers(len(_OCCUPATIONS_100K)))]
    else:
      age = _AGE_CODES_1M[int(rng.integers(len(_AGE_CODES_1M)))]
      occupation = int(rng.integers(21))
    users.append((uid, age, gender, occupation))

  popularity = rng.permutation(np.linspace(0.95, 0.1, num_movies))
  rows = []
  for uid, *_ in users:
    activity = rng.uniform(0.05, 0.9)
    for mid in np.flatnonzero(rng.random(num_movies) < activity * popularity) + 1:
      stamp = 880_000_000 + 1000 * int(rng.integers(0, 40))
      rows.append((uid, int(mid), int(rng.integers(1, 6)), stamp))
  order = rng.permutation(len(rows))  # real files are not sorted by user
  ratings = np.asarray([rows[int(i)] for i in order], dtype=np.int64).reshape(-1, 4)

  if layout == "ml-100k":
    _write_100k(directory, users, movies, ratings)
  else:
    _write_1m(directory, users, movies, ratings)
  return MovieLensFixture(path=directory, layout=layout, users=users, movies=movies,
                          ratings=ratings)


def _write_lines(path: str, lines: list[str]) -> None:
  with open(path, "w", encoding="latin-1", newline="\n") as f:
    f.write("".join(line + "\n" for line in lines))


def _write_100k(directory, users, movies, ratings) -> None:
  _write_lines(os.path.join(directory, "u.data"),
               ["\t".join(str(int(v)) for v in row) for row in ratings])
  _write_lines(os.path.join(directory, "u.user"),
               [f"{u}|{age}|{g}|{occ}|{10000 + u:05d}" for u, age, g, occ in users])
  item_lines = []
  for mid, title, genres in movies:
    flags = "|".join("1" if g in genres else "0" for g in movielens.GENRES)
    item_lines.append(f"{mid}|{title}|01-Jan-1990||http://example.invalid/{mid}|{flags}")
  _write_lines(os.path.join(directory, "u.item"), item_lines)
  _write_lines(os.path.join(directory, "u.genre"),
               [f"{g}|{i}" for i, g in enumerate(movielens.GENRES)] + [""])


def _write_1m(directory, users, movies, ratings) -> None:
  _write_lines(os.path.join(directory, "ratings.dat"),
               ["::".join(str(int(v)) for v in row) for row in ratings])
  _write_lines(os.path.join(directory, "users.dat"),
               [f"{u}::{g}::{age}::{occ}::{20000 + u:05d}" for u, age, g, occ in users])
  _write_lines(os.path.join(directory, "movies.dat"),
               [f"{mid}::{title}::{'|'.join(genres)}" for mid, title, genres in movies])


# ---------------------------------------------------------------- SearchQA

_SYLLABLES = (("Zor", "Qua", "Xel", "Vym", "Kyr", "Jub"), ("va", "be", "tri", "do", "ska"),
              ("th", "nok", "rix", "mund", "quel"))
_FILLER = ("the", "river", "museum", "history", "famous", "early", "city", "painter", "born",
           "known", "record", "island", "century", "first", "story", "local", "great", "old",
           "press", "film", "song", "about", "since", "north", "later", "after", "world")
_THINGS = ("river", "museum", "painter", "island", "film", "song", "city", "record")
_SITES = ("Encyclopedia", "Trivia Archive", "Fan Wiki", "Daily Gazette", "Q&A Forum")


@dataclasses.dataclass(frozen=True)
class SearchQAFixture:
  """What `write_searchqa_fixture` wrote: records as dicts {id, question, context, answers,
  split} in file order, with `answers` exactly as written (some escaped or quoted)."""
  path: str
  layout: str
  records: list[dict]


def _sentence(rng: np.random.Generator, words: int) -> str:
  return " ".join(_FILLER[int(k)] for k in rng.integers(len(_FILLER), size=words))


def _invented_answers(rng: np.random.Generator, count: int) -> list[str]:
  combos = [a + b + c for a in _SYLLABLES[0] for b in _SYLLABLES[1] for c in _SYLLABLES[2]]
  if count > len(combos):
    raise ValueError(f"At most {len(combos)} fixture questions, asked for {count}.")
  return [combos[int(k)] for k in rng.permutation(len(combos))[:count]]


def _searchqa_record(rng: np.random.Generator, i: int, answer: str) -> dict:
  """One question with 2-6 snippets. Every 6th question (i % 6 == 5) has no snippet holding its
  answer; every 5th (i % 5 == 2) ends with a bare, text-less title, as upstream truncation
  leaves; some answers are escaped (i % 7 == 4) or quoted with a second answer (i % 7 == 6)."""
  phrase, answers = answer, [answer]
  if i % 7 == 4:
    phrase, answers = f"{answer}'s Lair", [f"{answer}\\'s Lair"]
  elif i % 7 == 6:
    answers = [f'"{answer}"', answer.upper()]
  pieces = []
  for j in range(int(rng.integers(2, 7))):
    title = f"{_sentence(rng, 2).title()} - {_SITES[int(rng.integers(len(_SITES)))]}"
    text = _sentence(rng, int(rng.integers(6, 14)))
    if i % 6 != 5 and (j == 0 or rng.random() < 0.4):
      text += f" {phrase} {_sentence(rng, 3)}"
    # Search engines wrap snippet lines; the loader collapses these breaks.
    text = text.replace(" ", " \n", 1) + " ..."
    pieces.append(f"{searchqa.SNIPPET_MARKER} {searchqa.TITLE_MARKER} {title} "
                  f"{searchqa.TEXT_MARKER} {text}")
  if i % 5 == 2:
    pieces.append(f"{searchqa.SNIPPET_MARKER} {searchqa.TITLE_MARKER} {_sentence(rng, 2).title()}")
  return {"id": f"{int(rng.integers(2**63)):016x}{i:016x}",
          "question": f"This invented {_THINGS[i % len(_THINGS)]} is known for "
                      f"{_sentence(rng, 4)}",
          "context": " ".join(pieces), "answers": answers}


def write_searchqa_fixture(directory: str | os.PathLike, num_questions: int = 24, seed: int = 0,
                           layout: str = "skillopt") -> SearchQAFixture:
  """Writes invented SearchQA questions with snippets into `directory`.

  layout "skillopt" mirrors the offline copy: skillopt_split/{train,val}/items.json (JSON arrays;
  the first two thirds of the questions in train) plus an id_manifest/ of ids only, which the
  loader must ignore. Layout "mrqa" writes one SearchQA.jsonl.gz with MRQA's header line and
  {"context", "qas": [{"qid", "question", "answers"}]} records.
  """
  if layout not in ("skillopt", "mrqa"):
    raise ValueError(f"layout must be 'skillopt' or 'mrqa', got {layout!r}.")
  directory = os.fspath(directory)
  rng = np.random.default_rng(seed)
  records = []
  for i, answer in enumerate(_invented_answers(rng, num_questions)):
    record = _searchqa_record(rng, i, answer)
    record["split"] = "train" if i < (2 * num_questions + 2) // 3 else "val"
    records.append(record)

  if layout == "skillopt":
    root = os.path.join(directory, "skillopt_split")
    for split in ("train", "val"):
      items = [{k: r[k] for k in ("id", "question", "context", "answers")}
               for r in records if r["split"] == split]
      for sub, payload in ((split, items), (os.path.join("id_manifest", split),
                                            [{"id": r["id"]} for r in items])):
        os.makedirs(os.path.join(root, sub), exist_ok=True)
        with open(os.path.join(root, sub, "items.json"), "w", encoding="utf-8") as f:
          json.dump(payload, f, indent=2)
    with open(os.path.join(root, "id_manifest", "split_manifest.json"), "w",
              encoding="utf-8") as f:
      json.dump({"benchmark": "SearchQA", "manifest_type": "id_split"}, f)
  else:
    os.makedirs(directory, exist_ok=True)
    with gzip.open(os.path.join(directory, "SearchQA.jsonl.gz"), "wt", encoding="utf-8") as f:
      f.write(json.dumps({"header": {"dataset": "SearchQA", "split": "fixture"}}) + "\n")
      for r in records:
        qa = {"qid": r["id"], "question": r["question"], "answers": r["answers"]}
        f.write(json.dumps({"context": r["context"], "qas": [qa]}) + "\n")
  return SearchQAFixture(path=directory, layout=layout, records=records)
