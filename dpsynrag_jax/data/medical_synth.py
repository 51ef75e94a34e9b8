"""The Medical Synth corpus: doctor's notes of fictitious patients, and questions about them.

Built from the vendored tables in `vendored/medical_synth/` (see its README for the source and
license). The 10000 patients of `patients.json`, in that file's order, are permuted once with
`numpy.random.default_rng(seed).permutation`; the permutation is cut into fixed pools:

    positions [0, 8000)      database: one doctor's note per patient
    positions [8000, 9000)   validation queries
    positions [9000, 10000)  test queries

Asking for fewer documents or queries takes a prefix of its pool, so a small run's data is a
subset of a big run's data for the same seed, and no query patient is ever a database patient.

A database document is the note that upstream asked an LLM to rephrase:

    "Given the symptoms (<symptoms>) of <patient>. The diagnosis is <disease>, the treatment
    should be <treatment>."

with the disease's symptoms joined by ", " in the table's order and with the table's casing
(e.g. "Sudden craving for Wiener Schnitzel"): lower-casing would mangle the proper nouns some
symptoms hold, and stages that need case-folded words (keyword extraction) fold case themselves.

A query is the patient's own request, stripped of surrounding whitespace, then " What is my
disease?"; its gold answer is the patient's disease. Requests name the patient and describe the
symptoms, never the disease. Some disease names contain others ("Snurflesinus" in "Snurflesinus
Syndrome"), which a substring-match accuracy metric must keep in mind.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.resources
import json
import re
from typing import Any

import numpy as np

from dpsynrag_jax.data import matchers
from dpsynrag_jax.data.tasks import Task, TaskQuery

NUM_PATIENTS = 10_000
DATABASE_POOL = 8_000
VALIDATION_POOL = 1_000
TEST_POOL = 1_000

QUESTION_SUFFIX = "What is my disease?"
# The leakage experiment's extraction questions, over the public disease list.
ATTACK_QUESTION = "Who is the patient diagnosed with {disease}?"

_TABLES = ("patients", "diseases", "symptoms", "treatments", "disease_probabilities",
           "patient_diseases", "patient_requests")


def vendored_dir() -> importlib.resources.abc.Traversable:
  """The folder of the vendored tables inside the installed package."""
  return importlib.resources.files("dpsynrag_jax.data").joinpath("vendored", "medical_synth")


def listed_sha256() -> dict[str, str]:
  """File name -> sha256 as listed in the vendored README (the record of what was vendored)."""
  readme = vendored_dir().joinpath("README.md").read_text(encoding="utf-8")
  return {m.group(2): m.group(1)
          for m in re.finditer(r"^([0-9a-f]{64})  (\S+)$", readme, flags=re.MULTILINE)}


@functools.lru_cache(maxsize=1)
def _tables() -> dict[str, Any]:
  """Reads and checks every table once per process; callers must not mutate the result."""
  expected = listed_sha256()
  tables = {}
  for name in _TABLES:
    file_name = f"{name}.json"
    raw = vendored_dir().joinpath(file_name).read_bytes()
    # A table edited by hand or damaged on disk would change every result silently.
    digest = hashlib.sha256(raw).hexdigest()
    if digest != expected.get(file_name):
      raise ValueError(f"Vendored Medical Synth table {file_name} has sha256 {digest}, the "
                       f"README lists {expected.get(file_name)}; reinstall the package.")
    tables[name] = json.loads(raw.decode("utf-8"))
  patients = tables["patients"]
  if len(patients) != NUM_PATIENTS or len(set(patients)) != NUM_PATIENTS:
    raise ValueError(f"patients.json must list {NUM_PATIENTS} distinct names.")
  return tables


def doctor_note(symptoms: list[str], patient: str, disease: str, treatment: str) -> str:
  """The database document of one patient (module docstring has the template)."""
  return (f"Given the symptoms ({', '.join(symptoms)}) of {patient}. The diagnosis is {disease}, "
          f"the treatment should be {treatment}.")


def patient_question(request: str) -> str:
  """A query: the patient's request (stripped) followed by the question."""
  return f"{request.strip()} {QUESTION_SUFFIX}"


def split_patients(seed: int) -> tuple[list[str], list[str], list[str]]:
  """The seeded database, validation and test pools of patient names (8000, 1000, 1000)."""
  patients = _tables()["patients"]
  order = np.random.default_rng(seed).permutation(NUM_PATIENTS)
  names = [patients[i] for i in order]
  end_val = DATABASE_POOL + VALIDATION_POOL
  return names[:DATABASE_POOL], names[DATABASE_POOL:end_val], names[end_val:]


def _check_count(name: str, value: int, pool: int) -> None:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
    raise TypeError(f"{name} must be an int, got {type(value).__name__}.")
  if not 0 <= value <= pool:
    raise ValueError(f"{name} must be in [0, {pool}] (the size of its pool), got {value}.")


def public_term_groups() -> dict[str, list[str]]:
  """The tables' disease, symptom and treatment names, each list without repeats, in table
  order: the task's public vocabulary (which patient has which disease is the private part)."""
  t = _tables()
  groups = {
      "diseases": list(t["diseases"]),
      "symptoms": [s for d in t["diseases"] for s in t["symptoms"].get(d, [])],
      "treatments": [t["treatments"][d] for d in t["diseases"] if d in t["treatments"]],
  }
  return {name: list(dict.fromkeys(terms)) for name, terms in groups.items()}


def public_terms() -> list[str]:
  """Every disease, symptom and treatment name of the tables (public_term_groups), once."""
  return list(dict.fromkeys(t for terms in public_term_groups().values() for t in terms))


def load_medical_synth(num_documents: int = DATABASE_POOL, num_validation: int = VALIDATION_POOL,
                       num_test: int = TEST_POOL, seed: int = 0) -> Task:
  """The first `num_*` items of each pool of the split for `seed` (see the module docstring).

  Document i is database patient i's note; doc_answers[i] is (their disease,), doc_subjects[i]
  and doc_sources[i] their name (the private identifier, for the leakage metric). A query's
  subject is its held-out patient. `answer_names` is the public list of all 100 disease names
  (two of them have no patient).
  """
  _check_count("num_documents", num_documents, DATABASE_POOL)
  _check_count("num_validation", num_validation, VALIDATION_POOL)
  _check_count("num_test", num_test, TEST_POOL)
  t = _tables()
  database, validation, test = split_patients(seed)
  database = database[:num_documents]

  def queries(names: list[str]) -> tuple[TaskQuery, ...]:
    return tuple(TaskQuery(text=patient_question(t["patient_requests"][p]),
                           answers=(t["patient_diseases"][p],), subject=p, source=p)
                 for p in names)

  doc_diseases = [t["patient_diseases"][p] for p in database]
  documents = tuple(doctor_note(t["symptoms"][d], p, d, t["treatments"][d])
                    for p, d in zip(database, doc_diseases))
  diseases = tuple(t["diseases"])
  return Task(
      "medical", documents, tuple(sorted(set(database))), queries(validation[:num_validation]),
      queries(test[:num_test]), matchers.contains_any, "medical", 10,
      attack_queries=tuple(ATTACK_QUESTION.format(disease=d) for d in diseases),  # public names
      doc_answers=tuple((d,) for d in doc_diseases), doc_subjects=tuple(database),
      doc_sources=tuple(database), answer_names=diseases, seed=int(seed))
