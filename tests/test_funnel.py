"""The utility funnel: each stage's arithmetic on a hand-made build, and the app on tiny ones."""

import json
import os

import numpy as np
import pytest

from dpsynrag_jax import evaluation_artifacts as artifacts
from dpsynrag_jax.data.tasks import Task, TaskQuery
from dpsynrag_jax.evaluation import funnel
from dpsynrag_jax.rag import index as rag_index
from dpsynrag_jax.synrag import workdir as wd_lib
from experiments.configs import evaluate as evaluate_config
from experiments.configs import medical_synth

pytestmark = pytest.mark.slow   # builds end to end (the hand-made funnel test is fast but shares the module)


class _OneHotEncoder:
  """Texts and questions embed to the one-hot of the first known word they contain."""
  words = ("alpha", "beta", "gamma", "delta")

  def embed(self, texts):
    out = np.zeros((len(texts), len(self.words)), np.float32)
    for i, t in enumerate(texts):
      hits = [j for j, w in enumerate(self.words) if w in t.lower()]
      out[i, hits[0] if hits else 0] = 1.0
    return out


def _contains(text, answers):
  return any(a.lower() in text.lower() for a in answers)


def _hand_made_build(root):
  """4 clusters over 8 documents, texts decoded from 'tokens' that are characters."""
  wd = wd_lib.Workdir(str(root))
  os.makedirs(wd.private)
  members = [[0, 1, 2, 3], [4, 5], [], [6, 7]]
  wd_lib.append_jsonl(wd.private_path("selected.jsonl"),
                      [{"cluster": r, "members": m} for r, m in enumerate(members)])
  texts = ["notes on Alpha", "unrelated noise", "more noise", "about Gamma"]
  wd_lib.append_jsonl(wd.private_path("generated.jsonl"),
                      [{"cluster": r, "tokens": [ord(ch) for ch in t]}
                       for r, t in enumerate(texts)])
  released = [texts[0], texts[1], texts[3]]   # the empty cluster's noise was filtered
  wd_lib.append_jsonl(wd.path(wd_lib.SYNTHETIC_DB),
                      [{"text": t, "keyword": "k"} for t in released])
  rag_index.save_index(rag_index.build_index(_OneHotEncoder().embed(released)),
                       wd.path(wd_lib.INDEX))
  wd.mark_finished()
  return str(root)


def test_each_stage_on_a_hand_made_build(tmp_path):
  build = _hand_made_build(tmp_path / "build")
  # Documents' answers: cluster 0 is 3/4 Alpha, cluster 1 half Beta half Delta, cluster 3 all
  # Gamma.
  answers = ["Alpha", "Alpha", "Alpha", "Beta", "Beta", "Delta", "Gamma", "Gamma"]
  task = Task("toy", tuple(f"doc {i}" for i in range(8)), (), (),
              (TaskQuery("alpha?", ("Alpha",)), TaskQuery("beta?", ("Beta",)),
               TaskQuery("gamma?", ("Gamma",)), TaskQuery("delta?", ("Delta",))),
              _contains, None, 1, doc_answers=tuple((a,) for a in answers))
  out = funnel.build_funnel(build, task, _OneHotEncoder(), lambda ids: "".join(map(chr, ids)),
                            per_question={"correct": [1, 0, 0, 0]})
  by = {s["stage"]: s for s in out["stages"]}
  assert by["clusters"]["value"] == 3 and "2.7" in by["clusters"]["detail"]
  # Purity 0.75, 0.5, 1.0: all three >= 0.5, median 0.75, one of three >= 0.8.
  assert by["purity >= 0.5"]["value"] == 1.0
  assert by["purity >= 0.5"]["detail"] == "median 0.75; >= 0.8: 0.33"
  # Majorities: Alpha, Beta (tie with Delta broken alphabetically), Gamma.
  assert by["coverage"]["value"] == pytest.approx(3 / 4)
  # Pure clusters 0, 1, 3: texts name Alpha (yes), Beta (no), Gamma (yes).
  assert by["decode fidelity"]["value"] == pytest.approx(2 / 3)
  assert by["database recall"]["value"] == pytest.approx(2 / 4)
  assert by["context recall"]["value"] == pytest.approx(2 / 4)   # top-1 by the one-hot word
  # Top-1: a recalled question has exactly one right text, never two.
  assert by["context recall, >= 2 texts"]["value"] == 0.0
  assert by["context recall, >= 2 texts"]["detail"].startswith("mean 1.00")
  assert by["accuracy"]["value"] == pytest.approx(1 / 4)
  assert by["accuracy | context recall"]["value"] == pytest.approx(1 / 2)
  assert "coverage 75 %" in funnel.headline(out)


def test_a_reader_answers_over_the_retrieved_texts_for_the_accuracy_stages(tmp_path):
  build = _hand_made_build(tmp_path / "build")
  answers = ["Alpha", "Alpha", "Alpha", "Beta", "Beta", "Delta", "Gamma", "Gamma"]
  task = Task("toy", tuple(f"doc {i}" for i in range(8)), (), (),
              (TaskQuery("alpha?", ("Alpha",)), TaskQuery("beta?", ("Beta",)),
               TaskQuery("gamma?", ("Gamma",)), TaskQuery("delta?", ("Delta",))),
              _contains, None, 1, doc_answers=tuple((a,) for a in answers))
  seen = []

  def reader(questions, contexts):   # answers with the last word of its top text
    seen.append((list(questions), [list(c) for c in contexts]))
    return [c[0].split()[-1] if c else "" for c in contexts]

  out = funnel.build_funnel(build, task, _OneHotEncoder(), lambda ids: "".join(map(chr, ids)),
                            reader=reader)
  by = {s["stage"]: s["value"] for s in out["stages"]}
  assert seen[0][0] == ["alpha?", "beta?", "gamma?", "delta?"]
  assert seen[0][1] == [["notes on Alpha"], ["notes on Alpha"], ["about Gamma"],
                        ["notes on Alpha"]]
  assert by["accuracy"] == pytest.approx(2 / 4)                  # alpha? and gamma?
  assert by["accuracy | context recall"] == pytest.approx(1.0)


def test_topic_openings_count_in_the_texts_and_get_their_controls(tmp_path):
  build = _hand_made_build(tmp_path / "build")
  terms = tmp_path / "terms.txt"
  terms.write_text("Alpha\nBeta\nGamma\nDelta\n")
  wd = wd_lib.Workdir(build)
  wd_lib.atomic_write_json(wd.path(wd_lib.CONFIG),
                           {"generation": {"topic_terms": f"{terms}:1"}})
  wd_lib.atomic_write_json(wd.private_path("topic_leads.json"),
                           ["Alpha.", "Beta.", "Delta.", "Gamma."])
  answers = ["Alpha", "Alpha", "Alpha", "Beta", "Beta", "Delta", "Gamma", "Gamma"]
  task = Task("toy", tuple(f"doc {i}" for i in range(8)), (), (),
              (TaskQuery("alpha?", ("Alpha",)), TaskQuery("beta?", ("Beta",)),
               TaskQuery("gamma?", ("Gamma",)), TaskQuery("delta?", ("Delta",))),
              _contains, None, 1, doc_answers=tuple((a,) for a in answers))
  out = funnel.build_funnel(build, task, _OneHotEncoder(), lambda ids: "".join(map(chr, ids)))
  by = {s["stage"]: s for s in out["stages"]}
  # Cluster 1's text is noise, but its opening names Beta: every pure cluster names its answer.
  assert by["decode fidelity"]["value"] == 1.0
  # The openings alone: each question's top-1 is the opening of its own name.
  assert by["context recall, openings only"]["value"] == 1.0
  assert 0.0 <= by["context recall, chance"]["value"] <= 1.0
  assert by["context recall, chance"]["detail"] == "4 uniformly drawn openings"


def test_the_app_scores_the_tiny_evaluation_build(tmp_path):
  config = evaluate_config.get_config("tiny")
  out = funnel.run(config, str(tmp_path))
  assert len(out) == 1
  by = {s["stage"]: s["value"] for s in out[0]["stages"]}
  assert by["clusters"] <= config.dp_synrag.clustering.R
  assert by["context recall"] <= by["database recall"]
  assert by["accuracy"] is not None
  build = out[0]["build"]
  # An evaluation artifact: under the build's evaluation/ folder, labelled not DP; never beside
  # the released files, nor at the evaluation work dir's top.
  report = json.load(open(os.path.join(build, "evaluation", "funnel.json")))
  assert report[artifacts.FIELD]["differentially_private"] is False
  assert report["stages"] == out[0]["stages"]
  md = open(os.path.join(build, "evaluation", "funnel.md")).read()
  assert md.startswith("> **Evaluation artifact** (funnel): reads") and "NOT differentially private" in md
  assert not os.path.exists(os.path.join(build, "funnel.json"))
  assert not os.path.exists(tmp_path / "funnel_medical_seed0.json")
  summary = json.load(open(tmp_path / "evaluation" / "funnel_medical_seed0.json"))
  assert summary["questions"] == config.num_test and summary[artifacts.FIELD]["tool"] == "funnel"


def test_plan_chooses_clusters_without_decoding_on_validation_questions(tmp_path, capsys):
  config = medical_synth.get_config("tiny")
  out = funnel.plan(config, str(tmp_path / "plan"), num_questions=20)
  assert [s["stage"] for s in out["stages"]] == ["clusters", "purity >= 0.5", "coverage"]
  assert out["questions_from"] == "validation" and out["questions"] == 20
  assert not os.path.exists(tmp_path / "plan" / "private" / "generated.jsonl")
  # Tuning on the private labels is not private: said when it runs and in its report, with
  # where to tune instead.
  printed = capsys.readouterr().out
  assert "WARNING: Tuning settings on private labels is not private" in printed
  assert "NOT differentially private" in printed
  assert out["tuning_warning"] == funnel.TUNING_WARNING
  assert "public benchmark corpus" in funnel.TUNING_WARNING
  assert "validation questions of a public dataset" in funnel.TUNING_WARNING
  assert "disjoint public sample" in funnel.TUNING_WARNING
  plan = json.load(open(tmp_path / "plan" / "evaluation" / "plan.json"))
  assert plan["tuning_warning"] == funnel.TUNING_WARNING
  assert plan[artifacts.FIELD]["differentially_private"] is False
  assert "is not private" in open(tmp_path / "plan" / "evaluation" / "plan.md").read()
  assert not os.path.exists(tmp_path / "plan" / "private" / "plan.json")


def test_sampling_support_measures_real_spans(tmp_path):
  """experiments.sampling_support on a tiny build: the Grislain span never exceeds its bound
  2 |S| c / tau, and the figures land in the build's evaluation/ folder, labelled not DP."""
  from dpsynrag_jax.synrag import pipeline  # pylint: disable=g-import-not-at-top
  from experiments import sampling_support  # pylint: disable=g-import-not-at-top
  workdir = str(tmp_path / "build")
  pipeline.build_synthetic_db(medical_synth.get_config("tiny"), workdir)
  report = sampling_support.measure(workdir, num_clusters=2, rows_per_call=4)
  assert report["clusters"] == 2
  assert 0 < report["grislain"]["max_span"] <= report["grislain_bound_2_max_size_c"] + 1e-4
  assert report["difference"]["max_span"] > 0
  written = json.load(open(os.path.join(workdir, "evaluation", "sampling_support.json")))
  assert written[artifacts.FIELD]["tool"] == "sampling_support"
  assert written["grislain"] == report["grislain"]


def test_a_funnel_names_a_build_under_the_working_directory_by_a_relative_path(tmp_path,
                                                                             monkeypatch):
  """A report published from a work dir must not carry this machine's absolute paths."""
  monkeypatch.chdir(tmp_path)
  assert funnel._shown_path(str(tmp_path / "runs" / "build")) == os.path.join("runs", "build")
  assert funnel._shown_path("runs/build/") == os.path.join("runs", "build")
  outside = str(tmp_path.parent / "elsewhere")
  assert funnel._shown_path(outside) == outside
