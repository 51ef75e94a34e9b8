"""The MovieLens loader on generated fixtures (never the real data): selection, templates, split,
title matching and every error."""
# pylint: disable=protected-access

import os
import re

import numpy as np
import pytest

from dpsynrag_jax.data import fixtures, movielens, movielens_files
from dpsynrag_jax.data.matchers import answer_names_any, display_title, title_variants
from dpsynrag_jax.data.movielens import MovieLensError, load_movielens


@pytest.fixture(params=["ml-100k", "ml-1m"])
def written(request, tmp_path):
  return fixtures.write_movielens_fixture(tmp_path / request.param, layout=request.param, seed=3)


@pytest.fixture
def ml100k(tmp_path):
  return fixtures.write_movielens_fixture(tmp_path / "ml-100k", seed=1)


def _expected(fx, top_movies=30, favourites=10, min_rated=5):
  """Top movies and favourites recomputed from the fixture's own tables, with plain Python."""
  counts = {}
  for _, mid, _, _ in fx.ratings:
    counts[int(mid)] = counts.get(int(mid), 0) + 1
  top = sorted(counts, key=lambda m: (-counts[m], m))[:top_movies]
  rated = {}
  for uid, mid, rating, stamp in fx.ratings:
    if int(mid) in top:
      rated.setdefault(int(uid), []).append((-int(rating), int(stamp), int(mid)))
  titles = {mid: title for mid, title, _ in fx.movies}
  favs = {uid: [display_title(titles[m]) for _, _, m in sorted(r)[:favourites]]
          for uid, r in rated.items() if len(r) >= min_rated}
  return [display_title(titles[m]) for m in top], favs


def _all_users(data):
  return list(data.doc_sources) + [q.source for q in data.validation + data.test]


# ---------------------------------------------------------------- selection


def test_both_layouts_parse(written):
  data = load_movielens(written.path)
  top, favs = _expected(written)
  assert data.provenance["layout"] == written.layout
  assert list(data.answer_names) == top and len(top) == 30
  assert sorted(_all_users(data)) == sorted(favs)
  assert len(data.documents) == len(data.doc_subjects) == len(data.doc_answers)


def test_top_movies_only_and_favourites_are_top_rated(written):
  data = load_movielens(written.path)
  _, favs = _expected(written)
  assert len(written.movies) > 30  # so the restriction matters
  for uid, got in zip(data.doc_sources, data.doc_answers):
    assert list(got) == favs[uid]
    assert set(got) <= set(data.answer_names)
  for q in data.validation + data.test:
    assert list(q.answers) == favs[q.source]


def test_min_rated_and_favourites_parameters(ml100k):
  for min_rated, favourites in ((1, 10), (5, 10), (10, 3)):
    data = load_movielens(ml100k.path, min_rated=min_rated, favourites=favourites)
    _, favs = _expected(ml100k, favourites=favourites, min_rated=min_rated)
    assert sorted(_all_users(data)) == sorted(favs)
    assert all(1 <= len(f) <= favourites for f in data.doc_answers)
  assert len(_all_users(load_movielens(ml100k.path, min_rated=10))) < len(
      _all_users(load_movielens(ml100k.path, min_rated=1)))


def test_top_movies_parameter(ml100k):
  data = load_movielens(ml100k.path, top_movies=12)
  top, _ = _expected(ml100k, top_movies=12)
  assert list(data.answer_names) == top
  assert all(set(f) <= set(top) for f in data.doc_answers)


# ---------------------------------------------------------------- templates


def _user(fx, uid):
  return next(u for u in fx.users if u[0] == uid)


def _genre_phrase(fx, favourite_titles):
  genres = {display_title(t): g for _, t, g in fx.movies}
  counts = {}
  for title in favourite_titles:
    for g in genres[title]:
      counts[g] = counts.get(g, 0) + 1
  top = sorted(counts, key=lambda g: (-counts[g], movielens_files.GENRES.index(g)))[:3]
  top = [g.lower() for g in top]
  return top[0] if len(top) == 1 else f"{', '.join(top[:-1])} and {top[-1]}"


def test_document_template_ml100k(ml100k):
  data = load_movielens(ml100k.path)
  for i in range(len(data.documents)):
    uid, age, gender, occupation = _user(ml100k, data.doc_sources[i])
    he = "He" if gender == "M" else "She"
    occupation = {"healthcare": "healthcare worker", "none": "person with no occupation",
                  "other": "person with an unlisted occupation", "retired": "retiree",
                  "entertainment": "entertainment worker",
                  "marketing": "marketing professional"}.get(occupation, occupation)
    article = "an" if str(age).startswith("8") or age in (11, 18) else "a"
    favs = data.doc_answers[i]
    liked = favs[0] if len(favs) == 1 else f"{', '.join(favs[:-1])} and {favs[-1]}"
    expected = (f"{data.doc_subjects[i]} is {article} {age}-year-old "
                f"{'male' if gender == 'M' else 'female'} {occupation}. {he} mostly enjoys "
                f"{_genre_phrase(ml100k, favs)} movies. In particular, {he.lower()} likes "
                f"{liked}.")
    assert data.documents[i] == expected


def test_ml1m_ages_and_occupations(tmp_path):
  fx = fixtures.write_movielens_fixture(tmp_path, layout="ml-1m", num_users=200, seed=5)
  data = load_movielens(fx.path, min_rated=1)
  ages = {1: "a teenage", 18: "an 18-year-old", 25: "a 25-year-old", 35: "a 35-year-old",
          45: "a 45-year-old", 50: "a 50-year-old", 56: "a 56-year-old"}
  seen = set()
  for uid, doc in zip(data.doc_sources, data.documents):
    _, code, _, occ = _user(fx, uid)
    assert f" is {ages[code]} " in doc
    assert movielens_files._OCCUPATIONS_1M[occ] in doc
    seen.add(code)
  assert 1 in seen and 18 in seen


def test_query_template(written):
  data = load_movielens(written.path)
  pattern = re.compile(r"This user is an? (teenage|\d+-year-old) (male|female) [^.]+\. "
                       r"(He|She) mostly enjoys [^.]+ movies\. " + re.escape(
                           movielens.QUESTION_SUFFIX))
  for q in data.validation + data.test:
    assert pattern.fullmatch(q.text), q.text
    assert q.text.endswith("What movie is recommended for this user? Answer with movies "
                           "released in the 20th century.")
    assert q.subject not in q.text and q.subject.split()[1] not in q.text
    assert not any(t in q.text for t in q.answers)


def test_documents_name_no_query_user(ml100k):
  data = load_movielens(ml100k.path)
  query_names = {q.subject for q in data.validation + data.test}
  assert not any(name in doc for doc in data.documents for name in query_names)


# ---------------------------------------------------------------- pseudonyms


def test_pseudonyms_stable_unique_and_gendered(ml100k):
  a = load_movielens(ml100k.path, seed=0)
  b = load_movielens(ml100k.path, seed=7, min_rated=1)
  names_a = {q.source: q.subject for q in a.validation + a.test}
  names_a.update(zip(a.doc_sources, a.doc_subjects))
  names_b = {q.source: q.subject for q in b.validation + b.test}
  names_b.update(zip(b.doc_sources, b.doc_subjects))
  assert all(names_b[u] == n for u, n in names_a.items())  # same user, same name, any split
  assert len(set(names_b.values())) == len(names_b)
  for uid, name in names_b.items():
    first = name.split()[0]
    gender = _user(ml100k, uid)[2]
    pool = movielens._FIRST_MALE if gender == "M" else movielens._FIRST_FEMALE
    assert first in pool
  for uid, doc in zip(a.doc_sources, a.documents):
    assert doc.startswith(names_a[uid] + " is ")


def test_pseudonyms_cover_ml1m_scale():
  users = [(i, "M" if i % 3 else "F") for i in range(1, 6041)]
  names = movielens.pseudonyms(users)
  assert len(set(names.values())) == 6040
  assert movielens.pseudonyms(users[:100]) == {u: names[u] for u, _ in users[:100]}


# ---------------------------------------------------------------- split


def test_split_disjoint_and_pattern(written):
  data = load_movielens(written.path)
  docs, val = set(data.doc_sources), {q.source for q in data.validation}
  test = {q.source for q in data.test}
  assert not (docs & val or docs & test or val & test)
  n = len(docs) + len(val) + len(test)
  assert len(val) == len(range(0, n, movielens.POOL_PERIOD))
  assert len(test) == len(range(1, n, movielens.POOL_PERIOD))


def test_small_runs_are_prefixes_and_seeded(ml100k):
  full = load_movielens(ml100k.path, seed=4)
  small = load_movielens(ml100k.path, seed=4, num_documents=17, num_validation=3, num_test=2)
  assert small.documents == full.documents[:17]
  assert small.doc_subjects == full.doc_subjects[:17]
  assert small.validation == full.validation[:3] and small.test == full.test[:2]
  assert load_movielens(ml100k.path, seed=4) == full
  other = load_movielens(ml100k.path, seed=5)
  assert other.doc_sources != full.doc_sources
  assert sorted(_all_users(other)) == sorted(_all_users(full))
  empty = load_movielens(ml100k.path, num_documents=0, num_validation=0, num_test=0)
  assert empty.documents == () and empty.validation == () and empty.test == ()


def test_latin1_titles(tmp_path):
  fx = fixtures.write_movielens_fixture(tmp_path, num_movies=60, seed=2)
  assert any("é" in t for _, t, _ in fx.movies)
  with open(os.path.join(fx.path, "u.item"), "rb") as f:
    assert "é".encode("latin-1") in f.read()
  data = load_movielens(fx.path, top_movies=60, min_rated=1)
  titles = {display_title(t) for _, t, _ in fx.movies}
  assert set(data.answer_names) <= titles


# ---------------------------------------------------------------- titles


def test_display_title():
  assert display_title("Godfather, The (1972)") == "The Godfather (1972)"
  assert display_title("Star Wars (1977)") == "Star Wars (1977)"
  assert display_title("Postino, Il (1994)") == "Il Postino (1994)"
  assert display_title("Seventh Seal, The (Sjunde inseglet, Det) (1957)") == (
      "The Seventh Seal (Det Sjunde inseglet) (1957)")
  assert display_title("Ennui, L' (1998)") == "L'Ennui (1998)"


def test_title_variants():
  assert title_variants("Godfather, The (1972)") == [
      "Godfather, The (1972)", "Godfather, The", "The Godfather"]
  assert "Star Wars" in title_variants("Star Wars (1977)")
  assert {"Independence Day", "ID4"} <= set(title_variants("Independence Day (ID4) (1996)"))
  assert {"Ulysses", "Ulisse"} <= set(title_variants("Ulysses (a.k.a. Ulisse) (1954)"))
  episode = title_variants("Star Wars: Episode IV - A New Hope (1977)")
  assert {"A New Hope", "Star Wars: A New Hope"} <= set(episode) and "Star Wars" not in episode
  assert title_variants("The Godfather (1972)") == [
      "The Godfather (1972)", "The Godfather", "Godfather, The"]
  assert "Ennui, L'" in title_variants("L'Ennui (1998)")
  assert title_variants("Athens (1990)") == ["Athens (1990)", "Athens"]
  assert "Rock" not in title_variants("Rock, The (1996)")


@pytest.mark.parametrize("answer", [
    "The Godfather", "I recommend the godfather (1972).", "THE GODFATHER!",
    "Godfather, The", "Try Star Wars or The Godfather: Part II, and The Godfather."])
def test_answer_names_favourite(answer):
  assert answer_names_any(answer, ["Godfather, The (1972)"])
  assert answer_names_any(answer, ["The Godfather (1972)"])  # display form too


@pytest.mark.parametrize("answer,favourites", [
    ("The Godfather", ["Star Wars (1977)"]),
    ("Star Trek: First Contact", ["Star Wars (1977)"]),
    ("The Godfather Part II", ["Godfather, The (1972)"]),
    ("Godfather", ["Godfather, The (1972)"]),
    ("Aliens", ["Alien (1979)"]),
    ("You should contact a friend.", ["Contact (1997)"]),
    ("Star Trek: First Contact", ["Contact (1997)"]),
    ("Scream 2", ["Scream (1996)"]),
    ("Star Wars: Episode V - The Empire Strikes Back",
     ["Star Wars: Episode IV - A New Hope (1977)"]),
    ("", ["Star Wars (1977)"]),
])
def test_answer_names_no_false_positive(answer, favourites):
  assert not answer_names_any(answer, favourites)


def test_answer_names_any_variants():
  assert answer_names_any("Star Wars", ["Star Wars (1977)"])
  assert answer_names_any("I suggest Contact (1997).", ["Contact (1997)"])
  assert answer_names_any("Fargo, Contact and Scream", ["Contact (1997)"])
  assert answer_names_any('Watch "Contact".', ["Contact (1997)"])
  assert answer_names_any("La Cite des enfants perdus", ["Cité des enfants perdus, La (1995)"])
  assert answer_names_any("Monty Python & the Holy Grail",
                          ["Monty Python and the Holy Grail (1974)"])
  assert answer_names_any("Star Wars: Episode IV – A New Hope",
                          ["Star Wars: Episode IV - A New Hope (1977)"])
  assert answer_names_any("b", ["Star Wars (1977)", "Fargo (1996)"]) is False
  assert answer_names_any("Fargo", ["Star Wars (1977)", "Fargo (1996)"])
  assert not answer_names_any("Fargo", [])


def test_no_fixture_title_names_another(ml100k):
  data = load_movielens(ml100k.path, top_movies=45, min_rated=1)
  for a in data.answer_names:
    assert [b for b in data.answer_names if answer_names_any(a, [b])] == [a]


def test_answers_match_their_own_favourites(ml100k):
  data = load_movielens(ml100k.path)
  for q in data.test:
    assert answer_names_any(f"You might enjoy {q.answers[-1]}.", q.answers)


# ---------------------------------------------------------------- errors


def _rewrite(path, transform):
  with open(path, encoding="latin-1") as f:
    lines = f.read().splitlines()
  with open(path, "w", encoding="latin-1") as f:
    f.write("\n".join(transform(lines)) + "\n")


def test_missing_folder(tmp_path):
  with pytest.raises(MovieLensError, match=r"nowhere does not exist"):
    load_movielens(tmp_path / "nowhere")
  (tmp_path / "file").write_text("x")
  with pytest.raises(MovieLensError, match="not a folder"):
    load_movielens(tmp_path / "file")


def test_unrecognised_layout(tmp_path):
  (tmp_path / "ratings.csv").write_text("userId,movieId,rating,timestamp\n")
  with pytest.raises(MovieLensError, match=r"holds no MovieLens files.*u\.data.*ratings\.dat"):
    load_movielens(tmp_path)


@pytest.mark.parametrize("layout,missing", [("ml-100k", "u.user"), ("ml-100k", "u.data"),
                                            ("ml-1m", "movies.dat")])
def test_missing_file(tmp_path, layout, missing):
  fixtures.write_movielens_fixture(tmp_path, layout=layout)
  os.remove(tmp_path / missing)
  with pytest.raises(MovieLensError, match=rf"{layout} layout .* lacks {re.escape(missing)}"):
    load_movielens(tmp_path)


@pytest.mark.parametrize("file,line,bad,message", [
    ("u.data", 5, "1\t2\t3", r"u\.data, line 5: expected 4 fields"),
    ("u.data", 2, "1\t2\tfive\t880000000", r"u\.data, line 2: rating must be an integer"),
    ("u.data", 3, "1\t2\t9\t880000000", r"u\.data, line 3: rating must be in \[1, 5\]"),
    ("u.data", 4, "99999\t2\t3\t880000000", r"u\.data, line 4: user 99999 is not in"),
    ("u.data", 4, "1\t99999\t3\t880000000", r"u\.data, line 4: movie 99999 is not in"),
    ("u.user", 2, "2|30|X|writer|12345", r"u\.user, line 2: gender must be M or F"),
    ("u.user", 3, "1|30|M|writer|12345", r"u\.user, line 3: user 1 appears twice"),
    ("u.item", 6, "6|Bad|01-Jan-1990||url|0|1", r"u\.item, line 6: expected 24 fields"),
])
def test_malformed_line_ml100k(tmp_path, file, line, bad, message):
  fixtures.write_movielens_fixture(tmp_path)
  _rewrite(tmp_path / file, lambda lines: lines[:line - 1] + [bad] + lines[line:])
  with pytest.raises(MovieLensError, match=message):
    load_movielens(tmp_path)


def test_duplicate_rating(tmp_path):
  fx = fixtures.write_movielens_fixture(tmp_path)
  uid, mid = fx.ratings[0, :2]
  _rewrite(tmp_path / "u.data", lambda lines: lines + [f"{uid}\t{mid}\t3\t880000000"])
  with pytest.raises(MovieLensError, match=rf"line {len(fx.ratings) + 1}: user {uid} rated "
                     rf"movie {mid} already on line 1"):
    load_movielens(tmp_path)


@pytest.mark.parametrize("file,line,bad,message", [
    ("users.dat", 2, "2::M::30::4::12345", r"users\.dat, line 2: age code must be one of"),
    ("users.dat", 2, "2::M::25::42::12345", r"users\.dat, line 2: occupation code must be in"),
    ("movies.dat", 3, "3::Bad (1990)::Drama|Polka", r"movies\.dat, line 3: unknown genre 'Polka'"),
    ("ratings.dat", 7, "1::2", r"ratings\.dat, line 7: expected 4 fields separated by '::'"),
])
def test_malformed_line_ml1m(tmp_path, file, line, bad, message):
  fixtures.write_movielens_fixture(tmp_path, layout="ml-1m")
  _rewrite(tmp_path / file, lambda lines: lines[:line - 1] + [bad] + lines[line:])
  with pytest.raises(MovieLensError, match=message):
    load_movielens(tmp_path)


def test_empty_ratings_and_too_few_movies(tmp_path):
  fixtures.write_movielens_fixture(tmp_path, num_movies=45)
  with pytest.raises(MovieLensError, match="movies have ratings; top_movies=100"):
    load_movielens(tmp_path, top_movies=100)
  (tmp_path / "u.data").write_text("\n")
  with pytest.raises(MovieLensError, match=r"u\.data holds no ratings"):
    load_movielens(tmp_path)


def test_bad_arguments(ml100k):
  data = load_movielens(ml100k.path)
  with pytest.raises(ValueError, match=rf"num_test must be in \[0, {len(data.test)}\]"):
    load_movielens(ml100k.path, num_test=len(data.test) + 1)
  with pytest.raises(ValueError, match="num_documents must be in"):
    load_movielens(ml100k.path, num_documents=-1)
  with pytest.raises(TypeError, match="num_validation must be an int or None"):
    load_movielens(ml100k.path, num_validation=2.0)
  for name in ("top_movies", "favourites", "min_rated"):
    with pytest.raises(ValueError, match=f"{name} must be a positive int"):
      load_movielens(ml100k.path, **{name: 0})


def test_fixture_rejects_unknown_layout(tmp_path):
  with pytest.raises(ValueError, match="layout must be one of"):
    fixtures.write_movielens_fixture(tmp_path, layout="ml-25m")
  assert np.issubdtype(fixtures.write_movielens_fixture(tmp_path).ratings.dtype, np.integer)
