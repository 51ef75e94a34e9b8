"""Asking a built synthetic database: SyntheticDatabase and experiments.ask, on a tiny build."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from dpsynrag_jax.models import load_encoder, load_lm
from dpsynrag_jax.rag.database import DatabaseError, SyntheticDatabase
from dpsynrag_jax.synrag import pipeline
from experiments.configs import medical_synth

pytestmark = pytest.mark.slow   # a tiny build end to end


@pytest.fixture(scope="module")
def built(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("asked"))
  pipeline.build_synthetic_db(medical_synth.get_config("tiny"), workdir)
  return workdir


def _texts(workdir):
  return [json.loads(line)["text"] for line in open(os.path.join(workdir, "synthetic_db.jsonl"))]


def test_search_returns_released_texts_best_first(built):
  db = SyntheticDatabase.load(built)
  texts = _texts(built)
  assert len(db) == len(texts) > 2
  hits = db.search(texts[1], k=3)
  assert len(hits) == 3 and hits[0].text == texts[1]   # a text is nearest itself
  assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
  assert all(h.text in texts for h in hits)
  answer = db.answer(texts[1], load_lm("tiny-random"), k=2, max_new_tokens=4)
  assert isinstance(answer.text, str) and answer.text and len(answer.hits) == 2


def test_an_absent_index_is_rebuilt_from_the_texts(built, tmp_path):
  texts_only = tmp_path / "texts_only"
  texts_only.mkdir()
  for name in ("synthetic_db.jsonl", "config.json"):
    shutil.copy(os.path.join(built, name), texts_only / name)
  encoder = load_encoder("all-minilm-l6-v2")
  question = "fever and a rash on the palms"
  with_index = SyntheticDatabase.load(built, encoder).search(question, k=4)
  rebuilt = SyntheticDatabase.load(str(texts_only), encoder).search(question, k=4)
  assert [h.text for h in rebuilt] == [h.text for h in with_index]
  assert [h.score for h in rebuilt] == pytest.approx([h.score for h in with_index], abs=1e-5)


def test_a_folder_without_a_release_is_refused(tmp_path):
  with pytest.raises(DatabaseError, match="holds no released synthetic database"):
    SyntheticDatabase.load(str(tmp_path))


def test_the_app_prints_hits_and_an_answer_and_one_line_errors(built, tmp_path):
  questions = tmp_path / "questions.jsonl"
  questions.write_text(json.dumps({"question": "fever?"}) + "\n")
  run = lambda *flags: subprocess.run([sys.executable, "-m", "experiments.ask", *flags],
                                      capture_output=True, text=True, cwd=os.getcwd(),
                                      check=False)
  result = run(f"--db={built}", "--question=a rash and a fever", f"--questions={questions}",
               "--k=2", "--max_new_tokens=4", "--json")
  assert result.returncode == 0, result.stderr[-2000:]
  rows = json.loads(result.stdout)
  assert [r["question"] for r in rows] == ["a rash and a fever", "fever?"]
  assert all(len(r["hits"]) == 2 and r["answer"] is not None for r in rows)
  assert {h["text"] for r in rows for h in r["hits"]} <= set(_texts(built))
  missing = run(f"--db={tmp_path / 'none'}", "--question=x")
  assert missing.returncode == 2 and "Traceback" not in missing.stderr
  assert missing.stderr.strip().splitlines()[-1].startswith("error: ")
