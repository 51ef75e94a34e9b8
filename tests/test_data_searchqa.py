"""The SearchQA loader on generated fixtures (never the real data): layouts, snippets, gold
answers, selection, split and every error."""

import gzip
import json
import os

import pytest

from dpsynrag_jax.data import fixtures
from dpsynrag_jax.data.matchers import answer_contains_any, answer_contains_any_substring
from dpsynrag_jax.data.searchqa import (SearchQAError, gold_answers, load_searchqa,
                                        snippet_document, split_snippets)


@pytest.fixture
def skillopt(tmp_path):
  return fixtures.write_searchqa_fixture(tmp_path / "searchqa", seed=2)


def _answer_bearing(record):
  """Independent count: [PAR] pieces whose text holds the (unescaped, unquoted) answer."""
  answer = record["answers"][0].replace("\\'", "'").strip('"').lower()
  pieces = [p for p in record["context"].split("[DOC]") if "[PAR]" in p]
  return sum(answer in " ".join(p.split()).lower() for p in pieces)


# ---------------------------------------------------------------- snippets and answers


def test_split_snippets():
  context = ("[DOC] [TLE] First  Page - Site [PAR] Some \n wrapped text ... "
             "[DOC] [PAR] untitled text [DOC] plain text [DOC]  [DOC] [TLE] Cut off title "
             "[DOC] [TLE] Empty [PAR]   ")
  snippets, dropped = split_snippets(context)
  assert snippets == [("First Page - Site", "Some wrapped text ..."), ("", "untitled text"),
                      ("", "plain text")]
  assert dropped == 3
  assert snippet_document("First Page - Site", "Some text") == "First Page - Site\nSome text"
  assert snippet_document("", "Some text") == "Some text"


def test_split_snippets_errors():
  with pytest.raises(SearchQAError, match=r"here: the context has no \[DOC\] marker"):
    split_snippets("[TLE] a [PAR] b", "here")
  with pytest.raises(SearchQAError, match=r"text before its first \[DOC\]: 'preamble'"):
    split_snippets("preamble [DOC] [TLE] a [PAR] b")


def test_gold_answers():
  assert gold_answers(["Valentine\\'s Day"]) == ["Valentine's Day"]
  assert gold_answers(['"Give me liberty"', "Give me liberty"]) == ["Give me liberty"]
  assert gold_answers(["(The People\\'s Republic of) China"]) == [
      "(The People's Republic of) China", "China", "The People's Republic of China"]
  assert gold_answers(["Coca-\nCola", "  ", "Coca Cola"]) == ["Coca- Cola", "Coca Cola"]
  assert gold_answers(['"']) == ['"']


def test_answer_contains_any():
  assert answer_contains_any("The answer is TOM CLANCY, I think.", ["Tom Clancy"])
  assert answer_contains_any("tom\n  clancy", ["Tom Clancy"])
  assert answer_contains_any("Paris", ["London", "paris"])
  assert not answer_contains_any("Tom Hanks", ["Tom Clancy"])
  assert not answer_contains_any("anything", [])
  assert not answer_contains_any("anything", [""])
  # Whole words: a short gold answer is not found inside other words.
  assert not answer_contains_any("a cat and a dog", ["C"])
  assert not answer_contains_any("exactly 15 times", ["ex", "5"])
  assert answer_contains_any("Vitamin C, I think", ["C"])
  assert answer_contains_any("it is 5.", ["5"]) and answer_contains_any("U2's album", ["U2"])
  assert answer_contains_any("we love C++ here", ["C++"])
  assert answer_contains_any_substring("a cat", ["C"])


# ---------------------------------------------------------------- loading


def test_skillopt_layout(skillopt):
  data = load_searchqa(skillopt.path, min_answer_snippets=0)
  records = skillopt.records
  assert data.provenance["files"] == [
      os.path.join(skillopt.path, "skillopt_split", s, "items.json")
      for s in ("train", "val")]  # id_manifest/ is not read
  assert data.provenance["dropped_questions"] == 0
  assert len(data.validation) + len(data.test) == len(records)
  assert len(data.documents) == sum(r["context"].count("[PAR]") for r in records)
  assert data.provenance["dropped_snippets"] == sum(
      r["context"].count("[DOC]") - r["context"].count("[PAR]") for r in records) > 0
  by_id = {r["id"]: r for r in records}
  for q in data.validation + data.test:
    record = by_id[q.source]
    assert q.text == record["question"]
    assert list(q.answers) == gold_answers(record["answers"])
  for doc, title, qid in zip(data.documents, data.provenance["doc_titles"], data.doc_sources):
    assert doc.startswith(title + "\n") and title
    assert "\n" not in doc[len(title) + 1:] and "[PAR]" not in doc and "[DOC]" not in doc
    assert doc.split("\n", 1)[1].split()[0] in by_id[qid]["context"]


def test_mrqa_layout_reads_the_same(tmp_path):
  a = fixtures.write_searchqa_fixture(tmp_path / "a", seed=4)
  b = fixtures.write_searchqa_fixture(tmp_path / "b", seed=4, layout="mrqa")
  assert a.records == b.records
  data_a, data_b = load_searchqa(a.path, seed=1), load_searchqa(b.path, seed=1)
  assert data_b.provenance["files"] == [os.path.join(b.path, "SearchQA.jsonl.gz")]
  assert data_a.documents == data_b.documents
  assert data_a.validation == data_b.validation and data_a.test == data_b.test


def test_named_split_folder_and_single_file(skillopt):
  root = os.path.join(skillopt.path, "skillopt_split")
  assert load_searchqa(root) == load_searchqa(skillopt.path)
  one = load_searchqa(os.path.join(root, "val", "items.json"), min_answer_snippets=0)
  n_val = sum(r["split"] == "val" for r in skillopt.records)
  assert len(one.validation) + len(one.test) == n_val


def test_escaped_and_quoted_answers_are_cleaned(skillopt):
  data = load_searchqa(skillopt.path, min_answer_snippets=0)
  answers = [q.answers for q in data.validation + data.test]
  assert any(a[0].endswith("'s Lair") and "\\" not in a[0] for a in answers)
  assert any(len(a) == 2 and a[1] == a[0].upper() and '"' not in a[0] for a in answers)


def test_min_answer_snippets(skillopt):
  records = skillopt.records
  for minimum in (0, 1, 2):
    data = load_searchqa(skillopt.path, min_answer_snippets=minimum)
    kept = {r["id"] for r in records if _answer_bearing(r) >= minimum}
    assert {q.source for q in data.validation + data.test} == kept
    assert set(data.doc_sources) == kept
    assert data.provenance["dropped_questions"] == len(records) - len(kept)
  default = load_searchqa(skillopt.path)
  assert default.provenance["dropped_questions"] > 0  # the default drops the unanswerable
  database = " ".join(default.documents)
  assert all(answer_contains_any_substring(database, q.answers)
             for q in default.validation + default.test)


def test_split_disjoint_grouped_and_nested(skillopt):
  data = load_searchqa(skillopt.path, seed=3)
  val = [q.source for q in data.validation]
  test = [q.source for q in data.test]
  assert not set(val) & set(test) and len(val) - len(test) in (0, 1)
  # Documents come question by question, alternating validation and test questions.
  order = list(dict.fromkeys(data.doc_sources))
  assert order[0::2] == val and order[1::2] == test
  small = load_searchqa(skillopt.path, seed=3, num_documents=7, num_validation=2, num_test=1)
  assert small.documents == data.documents[:7]
  assert small.provenance["doc_titles"] == data.provenance["doc_titles"][:7]
  assert small.validation == data.validation[:2] and small.test == data.test[:1]
  assert load_searchqa(skillopt.path, seed=3) == data
  other = load_searchqa(skillopt.path, seed=4)
  assert other.test != data.test
  assert sorted(other.documents) == sorted(data.documents)


# ---------------------------------------------------------------- errors


def _items(skillopt, split="train"):
  return os.path.join(skillopt.path, "skillopt_split", split, "items.json")


def _edit_first_record(path, edit):
  with open(path, encoding="utf-8") as f:
    items = json.load(f)
  edit(items[0])
  with open(path, "w", encoding="utf-8") as f:
    json.dump(items, f)


def test_missing_path_and_no_files(tmp_path):
  with pytest.raises(SearchQAError, match=r"nowhere does not exist"):
    load_searchqa(tmp_path / "nowhere")
  (tmp_path / "notes.txt").write_text("x")
  with pytest.raises(SearchQAError, match=r"holds no SearchQA files; expected "
                     r"skillopt_split/\{train,val,test\}/items\.json"):
    load_searchqa(tmp_path)


def test_malformed_json_file(skillopt):
  with open(_items(skillopt), "w", encoding="utf-8") as f:
    f.write('[\n  {"id": "a",\n  oops\n]')
  with pytest.raises(SearchQAError, match=r"train/items\.json, line 3, column 3: malformed JSON"):
    load_searchqa(skillopt.path)


def test_malformed_jsonl_line(tmp_path):
  path = tmp_path / "SearchQA.jsonl"
  good = {"context": "[DOC] [TLE] t [PAR] Paris is nice", "qas": [
      {"qid": "q1", "question": "Capital?", "answers": ["Paris"]}]}
  path.write_text(json.dumps({"header": {}}) + "\n" + json.dumps(good) + "\n\n{broken\n")
  with pytest.raises(SearchQAError, match=r"SearchQA\.jsonl, line 4: malformed JSON"):
    load_searchqa(tmp_path)
  path.write_text(json.dumps({"header": {}}) + "\n" + json.dumps(good) + "\n[1]\n")
  with pytest.raises(SearchQAError, match=r"line 3: expected a JSON object, got list"):
    load_searchqa(tmp_path)


@pytest.mark.parametrize("edit,message", [
    (lambda r: r.pop("context"), r"record 1: no 'context' field \(fields: answers, id, question\)"),
    (lambda r: r.pop("id"), r"record 1: no 'id' / 'key' / 'qid' field"),
    (lambda r: r.update(answers="Paris"), r"record 1: field 'answers' must be a list, got str"),
    (lambda r: r.update(answers=[1]), r"record 1: 'answers' must be a list of strings"),
    (lambda r: r.update(answers=[" "]), r"record 1: no non-empty answer"),
    (lambda r: r.update(question=""), r"record 1: empty question"),
    (lambda r: r.update(context="no markers"), r"record 1: the context has no \[DOC\] marker"),
])
def test_malformed_record(skillopt, edit, message):
  _edit_first_record(_items(skillopt), edit)
  with pytest.raises(SearchQAError, match=r"train/items\.json, " + message):
    load_searchqa(skillopt.path)


def test_duplicate_id_across_files(skillopt):
  first_train_id = skillopt.records[0]["id"]
  _edit_first_record(_items(skillopt, "val"), lambda r: r.update(id=first_train_id))
  with pytest.raises(SearchQAError, match=rf"val/items\.json, record 1: question id "
                     rf"'{first_train_id}' already seen at .*train/items\.json, record 1"):
    load_searchqa(skillopt.path)


def test_not_an_array_and_bad_gzip(tmp_path):
  (tmp_path / "data.json").write_text('{"data": []}')
  with pytest.raises(SearchQAError, match=r"data\.json: expected a JSON array of records, got a "
                     r"dict"):
    load_searchqa(tmp_path)
  os.remove(tmp_path / "data.json")
  (tmp_path / "data.jsonl.gz").write_bytes(b"not gzip at all")
  with pytest.raises(SearchQAError, match=r"data\.jsonl\.gz: cannot be read as UTF-8 JSON"):
    load_searchqa(tmp_path)
  with gzip.open(tmp_path / "data.jsonl.gz", "wb") as f:
    f.write(b'{"header": {}}\n')
  with pytest.raises(SearchQAError, match=r"No questions in .*data\.jsonl\.gz"):
    load_searchqa(tmp_path)


def test_bad_arguments(skillopt):
  data = load_searchqa(skillopt.path)
  with pytest.raises(ValueError, match=rf"num_test must be in \[0, {len(data.test)}\]"):
    load_searchqa(skillopt.path, num_test=len(data.test) + 1)
  with pytest.raises(ValueError, match=rf"num_documents must be in \[0, {len(data.documents)}\]"):
    load_searchqa(skillopt.path, num_documents=len(data.documents) + 1)
  with pytest.raises(TypeError, match="num_validation must be an int or None"):
    load_searchqa(skillopt.path, num_validation="3")
  with pytest.raises(ValueError, match="min_answer_snippets must be an int >= 0"):
    load_searchqa(skillopt.path, min_answer_snippets=-1)
  with pytest.raises(ValueError, match="layout must be"):
    fixtures.write_searchqa_fixture(skillopt.path, layout="squad")
