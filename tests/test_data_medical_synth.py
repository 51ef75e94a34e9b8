"""Medical Synth: vendored tables intact, seeded split sizes, disjointness, nesting, templates."""

import hashlib
import json

import numpy as np
import pytest

from dpsynrag_jax.data import medical_synth as ms

JSON_TABLES = ["disease_probabilities.json", "diseases.json", "patient_diseases.json",
               "patient_requests.json", "patients.json", "symptoms.json", "treatments.json"]


@pytest.fixture(scope="module")
def full():
  return ms.load_medical_synth(seed=0)


def _diseases(task):
  """Each database note's disease (its one gold answer)."""
  return [a for (a,) in task.doc_answers]


def _table(name):
  return json.loads(ms.vendored_dir().joinpath(name).read_text(encoding="utf-8"))


def test_vendored_files_match_the_sha256_listed_in_their_readme():
  listed = ms.listed_sha256()
  assert sorted(listed) == JSON_TABLES
  for name, digest in listed.items():
    assert hashlib.sha256(ms.vendored_dir().joinpath(name).read_bytes()).hexdigest() == digest
  readme = ms.vendored_dir().joinpath("README.md").read_text(encoding="utf-8")
  assert "sarus-tech/dp-rag" in readme and "Apache License 2.0" in readme
  assert "Apache License" in ms.vendored_dir().joinpath("LICENSE").read_text(encoding="utf-8")


def test_split_sizes_and_disjointness(full):
  assert len(full.documents) == len(full.doc_answers) == len(full.doc_subjects) == 8000
  assert len(full.validation) == len(full.test) == 1000
  db = set(full.doc_subjects)
  val = {q.subject for q in full.validation}
  test = {q.subject for q in full.test}
  assert len(db) == 8000 and len(val) == 1000 and len(test) == 1000
  assert not db & val and not db & test and not val & test
  assert db | val | test == set(_table("patients.json"))


def test_split_is_a_seeded_permutation(full):
  again = ms.load_medical_synth(seed=0)
  assert again == full
  other = ms.load_medical_synth(seed=1)
  assert other.doc_subjects != full.doc_subjects
  assert set(other.doc_subjects) != set(full.doc_subjects)
  patients = _table("patients.json")
  order = np.random.default_rng(0).permutation(10_000)
  assert list(full.doc_subjects[:5]) == [patients[i] for i in order[:5]]
  assert full.test[-1].subject == patients[order[-1]]


def test_small_runs_are_prefixes_of_big_ones(full):
  small = ms.load_medical_synth(num_documents=50, num_validation=7, num_test=3, seed=0)
  assert small.documents == full.documents[:50]
  assert small.doc_subjects == full.doc_subjects[:50]
  assert _diseases(small) == _diseases(full)[:50]
  assert small.validation == full.validation[:7]
  assert small.test == full.test[:3]
  # Shrinking the database does not pull query patients into it, nor the reverse.
  assert small.validation[0].subject not in full.doc_subjects
  none = ms.load_medical_synth(num_documents=0, num_validation=0, num_test=0)
  assert none.documents == () and none.validation == () and none.test == ()


def test_document_template_on_one_patient(full):
  patient = full.doc_subjects[0]
  disease = _table("patient_diseases.json")[patient]
  symptoms = _table("symptoms.json")[disease]
  treatment = _table("treatments.json")[disease]
  assert _diseases(full)[0] == disease
  assert full.documents[0] == (
      f"Given the symptoms ({', '.join(symptoms)}) of {patient}. The diagnosis is {disease}, "
      f"the treatment should be {treatment}.")
  # The exact string for one fixed case, symptoms in table order and casing.
  note = ms.doctor_note(["Gas", "Sudden craving for Wiener Schnitzel"], "Ann Lee", "Zonkitis",
                        "Rest")
  assert note == ("Given the symptoms (Gas, Sudden craving for Wiener Schnitzel) of Ann Lee. "
                  "The diagnosis is Zonkitis, the treatment should be Rest.")


def test_queries(full):
  requests = _table("patient_requests.json")
  diseases = set(full.answer_names)
  assert len(full.answer_names) == 100
  patient_diseases = _table("patient_diseases.json")
  for q in full.validation + full.test:
    assert q.text.endswith(" What is my disease?")
    assert q.text == requests[q.subject].strip() + " What is my disease?"
    assert q.answers == (patient_diseases[q.subject],)
    assert q.answers[0] in diseases
  assert set(_diseases(full)) <= diseases


def test_bad_arguments():
  with pytest.raises(ValueError, match="num_documents"):
    ms.load_medical_synth(num_documents=8001)
  with pytest.raises(ValueError, match="num_test"):
    ms.load_medical_synth(num_test=-1)
  with pytest.raises(TypeError, match="num_validation"):
    ms.load_medical_synth(num_validation=10.0)


def test_results_are_frozen(full):
  with pytest.raises(AttributeError):
    full.seed = 3
  with pytest.raises(AttributeError):
    full.test[0].answers = ("x",)
