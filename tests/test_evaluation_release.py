"""What the evaluation releases and keys rows by: public settings only.

Under add/remove-one neighbours the corpus size is private, and a local path is no setting of
a benchmark: neither may reach a released build config, the build digest, or the settings that
key result rows, unless the evaluation config names it.
"""

import dataclasses
import json
import os

import ml_collections
import pytest

from dpsynrag_jax import evaluation
from dpsynrag_jax.data import fixtures
from dpsynrag_jax.synrag import workdir as wd_lib
from experiments import ablations
from experiments import publish
from experiments.configs import ablations as ablations_config
from experiments.configs import evaluate as evaluate_config
from experiments.configs import queries_vs_accuracy as qva_config

RESULTS = os.path.join(os.path.dirname(__file__), "..", "docs", "results")
# Published evaluations: folder -> (evaluation config arg, dataset).
EVALUATIONS = {"paper_cpu": ("paper_cpu", "medical"), "movielens_cpu": ("movielens_cpu",
                                                                          "movielens"),
               "searchqa_cpu": ("searchqa_cpu", "searchqa")}


@pytest.fixture(scope="module")
def movielens(tmp_path_factory):
  """The tiny evaluation config on a generated MovieLens folder, its task, and a neighbouring
  task (one document fewer)."""
  path = fixtures.write_movielens_fixture(tmp_path_factory.mktemp("ml") / "ml-100k").path
  config = evaluate_config.get_config("tiny")
  config.datasets = "movielens"
  config.paths.movielens = str(path)
  config.num_documents = 0
  task = evaluation.load_eval_task(config, "movielens")
  return config, task, dataclasses.replace(task, documents=task.documents[:-1])


def test_the_build_config_names_the_evaluation_cap_and_no_path(movielens):
  config, task, neighbour = movielens
  synrag = evaluation.synrag_config(config, task, 0)
  assert synrag.data.num_documents == config.num_documents == 0
  assert synrag.data.path == ""
  assert len(task.documents) != len(neighbour.documents)
  assert (evaluation.synrag_build_dir("w", synrag) ==
          evaluation.synrag_build_dir("w", evaluation.synrag_config(config, neighbour, 0)))
  capped = config.copy_and_resolve_references()
  capped.num_documents = 40   # a cap the config names is released, and names another build
  assert evaluation.synrag_config(capped, task, 0).data.num_documents == 40


@pytest.mark.parametrize("name", sorted(evaluation.METHOD_NAMES))
def test_row_settings_hold_no_corpus_size_or_path(movielens, name):
  config, task, neighbour = movielens
  settings = evaluation.method_settings(name, config, task, 0, 10)
  assert settings == evaluation.method_settings(name, config, neighbour, 0, 10)
  assert "documents" not in settings and "path" not in settings
  assert config.paths.movielens not in json.dumps(settings, default=str)
  assert settings["num_documents"] == 0
  if name not in evaluation.NOISELESS and name != "dp_synrag":
    assert settings["noise"] == "seeded"


def test_made_methods_draw_seeded_noise_and_dp_synrag_gets_the_documents(movielens):
  config, task, _ = movielens
  for name in ("dp_synth", "dp_rag", "aug_pe"):
    method = evaluation.make_method(name, config, task, None, None, 0, "w", 10)
    assert method.noise == "seeded" and method.noise_seed() == 0, name
  method = evaluation.make_method("dp_synrag", config, task, None, None, 0, "w", 10)
  assert method.documents == list(task.documents) and method.noise == "seeded"
  assert evaluation.make_method("rag", config, task, None, None, 0, "w", 10).noise is None


def test_one_work_dir_keys_one_set_of_documents_per_settings(movielens, tmp_path):
  config, task, neighbour = movielens
  evaluation.check_eval_data(str(tmp_path), config, "movielens", task)
  evaluation.check_eval_data(str(tmp_path), config, "movielens", task)   # the same: fine
  with pytest.raises(ValueError, match="other movielens documents under the same settings"):
    evaluation.check_eval_data(str(tmp_path), config, "movielens", neighbour)
  (record,) = os.listdir(tmp_path / wd_lib.PRIVATE / "data")
  kept = json.load(open(tmp_path / wd_lib.PRIVATE / "data" / record))
  assert kept["documents"] == len(task.documents)   # measured: private side only
  capped = config.copy_and_resolve_references()
  capped.num_documents = len(neighbour.documents)   # other settings: a record of their own
  evaluation.check_eval_data(str(tmp_path), capped, "movielens", neighbour)


def _published(folder: str, name: str):
  with open(os.path.join(RESULTS, folder, name), encoding="utf-8") as f:
    return json.load(f)


@pytest.mark.parametrize("folder", sorted(EVALUATIONS))
def test_published_evaluations_release_public_settings_only(folder):
  """docs/results: the build config holds the evaluation config's cap and no path; its
  digest names the rows' build (publish's check); the rows' settings digests are those of the
  current public settings; the rows say they are seeded benchmarks."""
  arg, dataset = EVALUATIONS[folder]
  config = evaluate_config.get_config(arg)
  build = _published(folder, wd_lib.CONFIG)
  assert build["data"]["path"] == ""
  assert build["data"]["num_documents"] == config.num_documents
  results = _published(folder, "results.json")
  assert results["note"] == evaluation.BENCHMARK_NOTE
  names = {v: k for k, v in evaluation.METHOD_NAMES.items()}
  task_of = {"medical": 10, "movielens": 15, "searchqa": 10}
  for row in results["rows"]:
    name = names[row["method"]]
    task = _StandIn(dataset, row["questions"], task_of[dataset])
    synrag = ml_collections.ConfigDict(build) if name == "dp_synrag" else None
    settings = evaluation.method_settings(name, config, task, row["seed"],
                                          row["questions"] + row["attacks"], synrag=synrag)
    assert row["settings"] == evaluation.settings_digest(settings), row["method"]
    assert row.get("noise") == (None if name in evaluation.NOISELESS else "seeded")
    if name == "dp_synrag":
      assert row["build"].endswith("_" + wd_lib.config_digest(build))


@pytest.mark.parametrize("folder", sorted(
    f for f in EVALUATIONS if os.path.exists(os.path.join(RESULTS, f, "queries_vs_accuracy.json"))))
def test_published_queries_vs_accuracy_points_are_keyed_by_public_settings(folder):
  """docs/results/*/queries_vs_accuracy.json: each point's settings digest is that of the
  current public settings (experiments.queries_vs_accuracy.points), a flat point read from an
  evaluate row names that row (evaluated_as), and noisy points say they are seeded."""
  arg, dataset = EVALUATIONS[folder]
  config = qva_config.get_config(arg)
  build = _published(folder, wd_lib.CONFIG)
  evaluated = {r["settings"] for r in _published(folder, "results.json")["rows"]}
  test = _published(folder, "results.json")["rows"][0]["questions"]
  points = _published(folder, "queries_vs_accuracy.json")
  assert points["note"] == evaluation.BENCHMARK_NOTE
  names = {v: k for k, v in evaluation.METHOD_NAMES.items()}
  task = _StandIn(dataset, test, {"medical": 10, "movielens": 15}[dataset])
  for row in points["rows"]:
    name = names[row["method"]]
    synrag = None
    if name == "dp_synrag":
      synrag = ml_collections.ConfigDict(build)
      synrag.privacy.epsilon = row["epsilon_total"]
    shared = evaluation.method_settings(name, config, task, row["seed"], row["questions"],
                                        synrag=synrag)
    assert row["settings"] == evaluation.settings_digest(
        {**shared, "epsilon_total": row["epsilon_total"], "queries": row["queries"],
         "questions": row["questions"]}), (row["method"], row["queries"])
    assert row.get("noise") == (None if name in evaluation.NOISELESS else "seeded")
    if "evaluated_as" in row:
      assert row["evaluated_as"] in evaluated
      assert row["evaluated_as"] == evaluation.settings_digest(evaluation.method_settings(
          name, config, task, row["seed"], test, synrag=synrag))


def test_published_ablation_rows_are_keyed_by_public_settings():
  """docs/results/paper_cpu/evaluation/ablations.json: each variant's build digest and row
  settings digest are those experiments.ablations computes today."""
  config = ablations_config.get_config("paper_cpu")
  build = _published("paper_cpu", wd_lib.CONFIG)
  report = _published("paper_cpu", os.path.join("evaluation", "ablations.json"))
  assert report["note"] == evaluation.BENCHMARK_NOTE
  task = _StandIn("medical", _published("paper_cpu", "results.json")["rows"][0]["questions"], 10,
                  "medical")
  for row in report["rows"]:
    base = ml_collections.ConfigDict(build)
    base.privacy.epsilon = row["epsilon_total"]
    synrag = ablations.variant_config(base, row["variant"])
    assert row["build"].endswith("_" + wd_lib.config_digest(synrag.to_dict()))
    assert row["settings"] == evaluation.settings_digest({
        "variant": row["variant"], **evaluation.method_settings(
            "dp_synrag", config, task, row["seed"], len(task.test), synrag=synrag)})
    assert row["noise"] == "seeded"


@pytest.mark.parametrize("path", sorted(
    os.path.relpath(os.path.join(d, f), RESULTS) for d, _, fs in os.walk(RESULTS)
    for f in fs if f == wd_lib.CONFIG))
def test_no_published_build_config_names_a_local_path(path):
  with open(os.path.join(RESULTS, path), encoding="utf-8") as f:
    assert json.load(f)["data"]["path"] == ""


@pytest.mark.parametrize("path", sorted(
    os.path.relpath(os.path.join(d, f), RESULTS) for d, _, fs in os.walk(RESULTS)
    for f in fs if f.endswith(".json")))
def test_no_published_report_names_a_build_by_a_local_absolute_path(path):
  """A report names its build relative to the work dir its README's command names."""
  def builds(value):
    if isinstance(value, dict):
      for k, v in value.items():
        yield from ([v] if k == "build" and isinstance(v, str) else builds(v))
    elif isinstance(value, list):
      for v in value:
        yield from builds(v)
  with open(os.path.join(RESULTS, path), encoding="utf-8") as f:
    assert not [b for b in builds(json.load(f)) if os.path.isabs(b)]


@dataclasses.dataclass
class _StandIn:
  """The public face of a task that method_settings reads (the data is not vendored)."""
  name: str
  questions: int
  top_k: int
  self_filter_prompt: str | None = None

  @property
  def test(self):
    return [None] * self.questions


def test_publish_refuses_a_build_config_that_names_a_local_path(tmp_path):
  build = tmp_path / "eval" / "dp_synrag" / "movielens_seed0_0123456789ab"
  (build / wd_lib.PRIVATE).mkdir(parents=True)
  (build / wd_lib.PRIVATE / "FINISHED").write_text("")
  (build / wd_lib.CONFIG).write_text(json.dumps({"data": {"path": "/home/me/ml-100k"}}))
  (tmp_path / "eval" / "results.json").write_text(json.dumps({"rows": [
      {"dataset": "movielens", "method": "DP-SynRAG", "seed": 0,
       "build": "dp_synrag/movielens_seed0_0123456789ab"}]}))
  with pytest.raises(ValueError, match="names the local path"):
    publish.publish(str(tmp_path / "eval"), "movielens", str(tmp_path / "out"))
  assert not (tmp_path / "out").exists()
