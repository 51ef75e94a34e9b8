"""The experiment apps on their tiny configs (what CI runs of them).

The apps share one work dir, as a user running them in turn would: the rare-topics and leakage
reports reuse the evaluation's rows, the ablations and the budget sweep reuse its DP-SynRAG build.
"""

import json
import os
import shutil

import pytest

from dpsynrag_jax import evaluation
from dpsynrag_jax import evaluation_artifacts as artifacts
from dpsynrag_jax import privacy
from dpsynrag_jax.evaluation import evaluate
from experiments import ablations
from experiments import leakage
from experiments import queries_vs_accuracy
from experiments import rare_topics
from experiments.configs import ablations as ablations_config
from experiments.configs import evaluate as evaluate_config
from experiments.configs import queries_vs_accuracy as qva_config
from experiments.configs import utility_options as utility_config
from experiments.configs import medical_synth

pytestmark = pytest.mark.slow   # every test runs an app end to end on the tiny configs


@pytest.fixture(scope="module")
def eval_dir(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("eval")
  config = evaluate_config.get_config("tiny")
  return str(workdir), config, evaluate.run(config, str(workdir))


def test_evaluate_tiny_writes_rows_table_and_plot(eval_dir):
  workdir, config, rows = eval_dir
  methods = {r["method"] for r in rows}
  assert methods == {"Non-RAG", "RAG", "DP-SynRAG", "DP-Synth", "DP-RAG", "Aug-PE"}
  by_method = {r["method"]: r for r in rows}
  assert by_method["Non-RAG"]["epsilon"] == 0 and by_method["Non-RAG"]["context_recall"] is None
  assert by_method["RAG"]["epsilon"] == float("inf")
  for name in ("DP-SynRAG", "DP-Synth", "Aug-PE"):
    assert abs(by_method[name]["epsilon"] - config.epsilon) < 1e-6, name
  # DP-RAG spends its per-query epsilon on every question, attacks included (the paper's Table 1):
  # each question is calibrated alone, so the total is their zCDP composition.
  asked = config.num_test + config.num_attacks
  rho = privacy.eps_to_zcdp(config.dp_rag.epsilon_per_query, config.delta)
  assert abs(by_method["DP-RAG"]["epsilon"] -
             privacy.zcdp_to_eps(asked * rho, config.delta)) < 1e-6
  assert by_method["RAG"]["context_recall"] >= 0.5
  for row in rows:
    assert row["attacks"] == config.num_attacks
    assert len(row["per_question"]["correct"]) == config.num_test
    assert abs(sum(row["per_question"]["correct"]) / config.num_test - row["accuracy"]) < 1e-9
  for name in ("table.md", "results.json", "accuracy.png"):
    assert os.path.getsize(os.path.join(workdir, name)) > 0
  table = open(os.path.join(workdir, "table.md")).read()
  assert "| medical | DP-SynRAG |" in table
  # A rerun skips finished rows (nothing is rebuilt or re-answered).
  again = evaluate.run(config, workdir)
  assert len(again) == len(rows)
  assert len(json.load(open(os.path.join(workdir, "results.json")))["rows"]) == len(rows)


def test_rows_of_older_matchers_are_scored_again_from_their_logs(eval_dir, tmp_path,
                                                                monkeypatch):
  workdir, config, rows = eval_dir
  copy = tmp_path / "eval"
  shutil.copytree(workdir, copy)
  results = copy / "results.jsonl"
  stale = []
  for row in (json.loads(line) for line in results.read_text().splitlines()):
    row.pop("scoring", None)   # as rows were written before matchers had versions
    row["accuracy"], row["per_question"] = -1.0, None
    stale.append(row)
  results.write_text("".join(json.dumps(r) + "\n" for r in stale))

  def no_answering(*args, **kwargs):
    raise AssertionError("a rescored row must not be built or answered again")

  monkeypatch.setattr(evaluate, "evaluate_method", no_answering)
  again = evaluate.run(config, str(copy))
  by_method = {r["method"]: r for r in rows}
  for row in again:
    assert row["scoring"] == evaluation.SCORING
    assert row["accuracy"] == by_method[row["method"]]["accuracy"]
    assert row["per_question"] == by_method[row["method"]]["per_question"]
  assert len(results.read_text().splitlines()) == 2 * len(rows)   # appended, never rewritten
  evaluate.run(config, str(copy))                                  # current rows: nothing new
  assert len(results.read_text().splitlines()) == 2 * len(rows)


def test_rare_topics_buckets_every_question(eval_dir):
  workdir, config, rows = eval_dir
  cells = rare_topics.run(config, workdir, edges=[1, 10, 30])
  labels = rare_topics.bucket_labels([1, 10, 30])
  assert labels == ["0", "1-9", "10-29", "30+"]
  rag = [c for c in cells if c["method"] == "RAG"]
  assert sorted(c["bucket"] for c in rag) == sorted(labels)
  assert sum(c["questions"] for c in rag) == config.num_test
  # The buckets partition the questions, so their pooled accuracy is the row's accuracy.
  row = next(r for r in rows if r["method"] == "RAG")
  pooled = sum(c["accuracy"] * c["questions"] for c in rag if c["questions"])
  assert abs(pooled / config.num_test - row["accuracy"]) < 1e-9
  assert "| medical | RAG |" in open(os.path.join(workdir, "evaluation", "rare_topics.md")).read()
  assert os.path.getsize(os.path.join(workdir, "evaluation", "rare_topics.png")) > 0


def test_rare_topics_bucket_edges():
  edges = [1, 10, 30]
  assert [rare_topics.bucket_of(v, edges) for v in (0, 1, 9, 10, 29, 30, 500)] == [
      0, 1, 1, 2, 2, 3, 3]
  assert rare_topics.bucket_labels([0, 5]) == ["0-4", "5+"]
  assert rare_topics.bucket_of(0, [0, 5]) == 0


def test_leakage_reports_benign_and_attack_counts_for_every_method(eval_dir):
  workdir, config, rows = eval_dir
  summary = leakage.run(config, workdir)
  assert {s["method"] for s in summary} == {r["method"] for r in rows}
  for s in summary:
    assert s["attack_questions"] == config.num_attacks
    assert 0 <= s["attack_leaks"] <= config.num_attacks
    assert 0 <= s["benign_leaks"] <= config.num_test
  # Evaluation artifacts (counted against the private names): under evaluation/, labelled.
  assert not os.path.exists(os.path.join(workdir, "leakage.md"))
  text = open(os.path.join(workdir, "evaluation", "leakage.md")).read()
  assert text.startswith(artifacts.markdown_header(leakage.TOOL, leakage.READS))
  assert "| medical | DP-SynRAG |" in text
  report = json.load(open(os.path.join(workdir, "evaluation", "leakage.json")))
  assert report[artifacts.FIELD]["differentially_private"] is False
  assert report["summary"] == json.loads(json.dumps(summary))
  # Counts only: no private name appears in the reports.
  task = evaluation.load_eval_task(config, "medical")
  assert not any(name in text for name in task.private_names)
  assert not any(name in json.dumps(report) for name in task.private_names)


def test_ablations_change_one_switch_and_reuse_the_full_build(eval_dir):
  workdir, _, rows = eval_dir
  config = ablations_config.get_config("tiny")
  summary = ablations.run(config, workdir)
  by_variant = {s["variant"]: s for s in summary}
  assert set(by_variant) == {"full", "no_rerank", "no_self_filter", "hard"}
  full_row = next(r for r in rows if r["method"] == "DP-SynRAG")
  # "full" is the evaluation's build, read back rather than rebuilt.
  assert by_variant["full"]["accuracy"] == full_row["accuracy"]
  assert by_variant["full"]["accuracy_change"] == 0
  # Without re-ranking its mechanisms are never charged, so less than the budget is spent.
  assert by_variant["no_rerank"]["epsilon"] < config.epsilon - 1e-3
  assert abs(by_variant["hard"]["epsilon"] - config.epsilon) < 1e-6
  # The reports are evaluation artifacts (funnels of private state): under evaluation/.
  reports = os.path.join(workdir, "evaluation")
  for name in ("ablations.json", "ablations.md", "ablations_funnel.md"):
    assert not os.path.exists(os.path.join(workdir, name)), name
  assert "| medical | 10 | hard |" in open(os.path.join(reports, "ablations.md")).read()
  report = json.load(open(os.path.join(reports, "ablations.json")))
  assert report[artifacts.FIELD]["tool"] == ablations.TOOL
  assert report["note"] == evaluation.BENCHMARK_NOTE
  assert {r["variant"] for r in report["rows"]} == set(by_variant)
  # Each variant carries its build's funnel, whose last stages are the row's own figures.
  rows = ablations.sweep_rows(config, workdir)
  for row in rows:
    assert row["noise"] == "seeded"
    by_stage = {s["stage"]: s["value"] for s in row["funnel"]}
    assert by_stage["context recall"] == pytest.approx(row["context_recall"])
    assert by_stage["accuracy"] == pytest.approx(row["accuracy"])
  funnel_md = open(os.path.join(reports, "ablations_funnel.md")).read()
  assert funnel_md.startswith(artifacts.markdown_header(ablations.TOOL, ablations.READS))
  assert "| coverage |" in funnel_md and "| full | no_rerank | no_self_filter | hard |" in funnel_md
  # A row from before funnels gets one on the next run, the row's figures unchanged.
  stripped = [{k: v for k, v in r.items() if k != "funnel"} for r in rows]
  with open(os.path.join(workdir, "ablations.jsonl"), "w") as f:
    f.write("".join(json.dumps(r) + "\n" for r in stripped))
  ablations.run(config, workdir)
  again = ablations.sweep_rows(config, workdir)
  assert [r["funnel"] for r in again] == [r["funnel"] for r in rows]
  assert [r["accuracy"] for r in again] == [r["accuracy"] for r in rows]
  with pytest.raises(ValueError, match="Unknown variant"):
    ablations.variant_config(config.dp_synrag, "no_such")


def test_variants_combine_with_plus():
  base = utility_config.get_config("tiny").dp_synrag
  with pytest.raises(ValueError, match="Unknown variant 'typo'"):
    ablations.variant_config(base, "rdp+typo")
  both = ablations.variant_config(base, "rdp+public_prior")
  assert (both.privacy.accountant, both.generation.omega) == ("rdp", 0.1)
  assert (base.privacy.accountant, base.generation.omega) == ("closed_form", 0.0)  # untouched
  rows = [{"dataset": "m", "epsilon_total": 3.0, "variant": v, "accuracy": 0.1,
           "context_recall": 0.2, "epsilon": 3.0, "synthetic_texts": 4, "seconds_build": 1.0}
          for v in ("rdp+public_prior", "full", "rdp")]
  assert [s["variant"] for s in ablations.summarize(rows)] == ["full", "rdp", "rdp+public_prior"]


def test_queries_vs_accuracy_splits_dp_rag_budget_and_keeps_dp_synrag_flat(eval_dir):
  workdir, _, _ = eval_dir
  config = qva_config.get_config("tiny")
  summary = queries_vs_accuracy.run(config, workdir)
  methods = {s["method"] for s in summary}
  assert methods == {"Non-RAG", "RAG", "DP-SynRAG", "DP-RAG"}
  counts = [1, 3]
  for eps in (3.0, 10.0):
    synrag = [s for s in summary if s["method"] == "DP-SynRAG" and s["epsilon_total"] == eps]
    assert sorted(s["queries"] for s in synrag) == counts
    assert len({s["accuracy"] for s in synrag}) == 1     # one build, any number of questions
    dp_rag = [s for s in summary if s["method"] == "DP-RAG" and s["epsilon_total"] == eps]
    assert sorted(s["queries"] for s in dp_rag) == counts
  for name in ("queries_vs_accuracy.md", "queries_vs_accuracy.png"):
    assert os.path.getsize(os.path.join(workdir, name)) > 0


def test_queries_vs_accuracy_takes_flat_points_from_evaluate_rows(monkeypatch, tmp_path):
  from dpsynrag_jax import baselines  # pylint: disable=g-import-not-at-top
  config = qva_config.get_config("tiny")
  config.epsilons, config.query_counts = "3", "2"
  task = evaluation.load_eval_task(config, "medical")
  m = len(task.test)
  evaluated = []
  for i, name in enumerate(("non_rag", "rag", "dp_synrag")):
    synrag = None
    if name == "dp_synrag":
      synrag = evaluation.synrag_config(config, task, 0)
      synrag.privacy.epsilon = 3.0
    key = evaluation.settings_digest(evaluation.method_settings(
        name, config, task, 0, m, synrag=synrag))
    correct = [int(q < i + 1) for q in range(m)]       # the first i + 1 questions right
    recalled = None if name == "non_rag" else [1] * (m - 1) + [0]
    evaluated.append({"settings": key, "method": name, "accuracy": sum(correct) / m,
                      "context_recall": None if recalled is None else sum(recalled) / m,
                      "per_question": {"correct": correct, "recalled": recalled}})
  def workdir(name):
    os.makedirs(tmp_path / name)
    (tmp_path / name / "results.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in evaluated))
    return str(tmp_path / name)

  def no_method(*args, **kwargs):
    raise AssertionError("a flat point evaluate scored must not be built or answered again")

  monkeypatch.setattr(evaluation, "make_method", no_method)
  def sessions(*args, log_path):   # logs as the real one does: 2.5 s a question
    out = baselines.Answers(["-"] * len(args[5]), [[] for _ in args[5]])
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    evaluation.log_answers(log_path, [q.text for q in args[5]], out, 2.5 * len(args[5]))
    return out

  monkeypatch.setattr(queries_vs_accuracy, "dp_rag_sessions", sessions)
  for asked in (m, 2):   # every test question, then the first two: their own scores
    config.num_questions = asked
    rows = queries_vs_accuracy.points(config, workdir(f"q{asked}"))
    flat = {r["method"]: r for r in rows if r["queries"] is None}
    assert [flat[k]["accuracy"] for k in ("Non-RAG", "RAG", "DP-SynRAG")] == pytest.approx(
        [min(i + 1, asked) / asked for i in range(3)])
    assert flat["Non-RAG"]["context_recall"] is None
    assert flat["RAG"]["context_recall"] == pytest.approx(min(asked, m - 1) / asked)
    assert [flat[k]["evaluated_as"] for k in ("Non-RAG", "RAG", "DP-SynRAG")] == [
        r["settings"] for r in evaluated]
    (dp_rag,) = [r for r in rows if r["queries"] is not None]
    assert dp_rag["seconds"] == pytest.approx(2.5 * asked, abs=0.01)   # from its session log
  # An evaluate row of other settings (another budget) is not these answers: computed.
  config.epsilons = "5"
  with pytest.raises(AssertionError, match="must not be built"):
    queries_vs_accuracy.points(config, workdir("other"))


def test_utility_options_spend_the_same_budget_and_share_builds(eval_dir):
  workdir, _, _ = eval_dir
  config = utility_config.get_config("tiny")
  queries_vs_accuracy.run(qva_config.get_config("tiny"), workdir)  # finished rows: no work
  builds_before = set(os.listdir(os.path.join(workdir, "dp_synrag")))
  summary = ablations.run(config, workdir)
  assert {s["variant"] for s in summary} == set(config.variants.split(","))
  for s in summary:
    assert s["epsilon_total"] == 3.0
    # Each run's own accountant reads exactly the budget (rdp: the RDP accountant).
    assert abs(s["epsilon"] - 3.0) < 1e-4, s["variant"]
  builds = set(os.listdir(os.path.join(workdir, "dp_synrag")))
  # The full method at eps 3 is queries_vs_accuracy's build, reused; each variant built once.
  full = next(s for s in summary if s["variant"] == "full")
  rows = [json.loads(line) for line in open(os.path.join(workdir, "utility_options.jsonl"))]
  assert next(r["build"] for r in rows if r["variant"] == "full").split("/")[-1] in builds_before
  assert len(builds - builds_before) == len(config.variants.split(",")) - 1
  assert full["epsilon"] == pytest.approx(3.0, abs=1e-4)
  assert "| medical | 3 | difference |" in open(
      os.path.join(workdir, "evaluation", "utility_options.md")).read()


def test_dp_rag_sessions_charge_each_session_its_whole_budget_and_resume(monkeypatch, tmp_path):
  from dpsynrag_jax import baselines  # pylint: disable=g-import-not-at-top
  from dpsynrag_jax.baselines import dp_rag  # pylint: disable=g-import-not-at-top
  calls = []

  class Recorder(dp_rag.DPRAG):
    def build(self):
      calls.append(("build", self.ledger.epsilon))
      self.predictor = object()

    def answer(self, questions):
      calls.append(("answer", len(questions)))
      if stop_at == self.session:
        raise KeyboardInterrupt
      return baselines.Answers([f"s{self.session}q{i}" for i in range(len(questions))],
                               [[f"doc{self.session}"] for _ in questions])

  config = qva_config.get_config("tiny")
  monkeypatch.setattr(baselines, "DPRAG", Recorder)
  task = evaluation.load_eval_task(config, "medical")
  sessions = lambda log=None: queries_vs_accuracy.dp_rag_sessions(
      config, task, None, None, None, task.test[:5], eps_total=3.0, n=2, seed=0, log_path=log)
  stop_at = None
  out = sessions()
  assert out.answers == ["s0q0", "s0q1", "s1q0", "s1q1", "s2q0"]
  assert [c for c in calls if c[0] == "answer"] == [("answer", 2), ("answer", 2), ("answer", 1)]
  assert all(c[1] == 3.0 for c in calls if c[0] == "build")
  # Cut off in session 1, then rerun: only the unlogged sessions are asked, same answers.
  log = str(tmp_path / "private" / "sessions.jsonl")
  stop_at = 1
  with pytest.raises(KeyboardInterrupt):
    sessions(log)
  stop_at, calls[:] = None, []
  assert sessions(log) == out
  assert [c for c in calls if c[0] == "answer"] == [("answer", 2), ("answer", 1)]
  calls[:] = []
  assert sessions(log) == out and not calls   # a finished point asks nothing


def test_demo_runs_end_to_end_on_the_tiny_config(tmp_path, capsys):
  from experiments import demo  # pylint: disable=g-import-not-at-top
  scored = demo.run(str(tmp_path), num_questions=2, funnel_questions=4, config_arg="tiny")
  out = capsys.readouterr().out
  assert "spent epsilon = 10.000" in out
  assert funnel_headline_in(out) and scored["questions"] == 4
  assert "; accuracy " in out and out.count("evaluation: gold = ") == 2
  # The first released texts, in release order, whatever they are.
  build = demo.build_dir(medical_synth.get_config("tiny"), str(tmp_path))
  released = [json.loads(line) for line in open(os.path.join(build, "synthetic_db.jsonl"))]
  shown = [line for line in out.splitlines() if line.startswith("  [")]
  assert shown == [f"  {demo.one_line(r)}" for r in released[:5]] and len(shown) == 5
  # The paper-scale figures are quoted from the committed results, labelled as such.
  assert "docs/results/paper_cpu/results.json, NOT recomputed" in out
  assert "DP-SynRAG  eps      10  accuracy  19.0 %  context recall 58 %" in out
  demo.run(str(tmp_path), num_questions=2, funnel_questions=4, config_arg="tiny")
  assert "Reusing the finished build" in capsys.readouterr().out


def funnel_headline_in(text: str) -> bool:
  return "coverage" in text and "database recall" in text and "context recall" in text


def test_dp_synrag_fields_the_evaluation_fills_cannot_be_set_silently():
  config = evaluate_config.get_config("tiny")
  task = evaluation.load_eval_task(config, "medical")
  assert evaluation.synrag_config(config, task, 0).privacy.epsilon == config.epsilon
  for dotted, value, source in [("privacy.epsilon", 3.0, "epsilon"), ("seed", 4, "seeds"),
                                ("data.num_documents", 10, "num_documents"),
                                ("self_filter.enabled", True, "self_filter")]:
    bad = evaluate_config.get_config("tiny")
    node = bad.dp_synrag
    *parents, name = dotted.split(".")
    for p in parents:
      node = node[p]
    node[name] = value   # what --config.dp_synrag.<dotted>=<value> does
    with pytest.raises(ValueError, match=rf"dp_synrag.{dotted} is set by the evaluation from "
                                         rf"{source}"):
      evaluation.synrag_config(bad, task, 0)


def test_the_epsilon_sweep_moves_dp_rag_too():
  budgets = []
  for point in evaluate_config.get_sweep("epsilon"):
    config = evaluate_config.get_config("tiny")
    for key, value in point.items():
      node = config
      *parents, name = key.split(".")
      for p in parents:
        node = node[p]
      node[name] = value
    budgets.append((config.epsilon, evaluation.dp_rag_budget(config, 10)))
  assert [b for _, b in budgets] == [{"per_question": e} for e, _ in budgets]
  assert len({b["per_question"] for _, b in budgets}) == 4


def test_ablations_read_the_budget_when_they_run():
  config = ablations_config.get_config("tiny")
  config.epsilon = 3.0   # --config.epsilon=3
  assert ablations.budgets(config) == [3.0]
  config.epsilons = "5,2"
  assert ablations.budgets(config) == [5.0, 2.0]


def test_option_combinations_that_do_nothing_are_refused():
  from dpsynrag_jax.privacy import PrivateTokenSelector
  with pytest.raises(ValueError, match="omega.*no effect with clip='difference'"):
    PrivateTokenSelector(c=0.1, method="difference", omega=0.1)
  with pytest.raises(ValueError, match="candidates > 0"):
    PrivateTokenSelector(c=0.1, candidate_ids=(3, 4))
  PrivateTokenSelector(c=0.1, candidates=5, candidate_ids=(3, 4))   # the working combination


def test_rows_and_builds_are_keyed_by_their_settings(tmp_path):
  """A rerun with other settings in the same work dir computes new rows; the tables show the
  current settings' rows; builds of other configs get their own directories."""
  from dpsynrag_jax.synrag import workdir as wd_lib  # pylint: disable=g-import-not-at-top
  config = evaluate_config.get_config("tiny")
  config.methods = "non_rag"
  first = evaluate.run(config, str(tmp_path))
  config.answer_tokens = 2
  second = evaluate.run(config, str(tmp_path))
  assert len(first) == len(second) == 1 and first[0]["settings"] != second[0]["settings"]
  assert len(open(tmp_path / "results.jsonl").read().splitlines()) == 2
  assert len(json.load(open(tmp_path / "results.json"))["rows"]) == 1
  assert evaluate.run(config, str(tmp_path))[0]["settings"] == second[0]["settings"]
  assert len(open(tmp_path / "results.jsonl").read().splitlines()) == 2   # reused
  task = evaluation.load_eval_task(config, "medical")
  at10 = evaluation.synrag_config(config, task, 0)
  at3 = evaluation.synrag_config(config, task, 0)
  at3.privacy.epsilon = 3.0
  assert (evaluation.synrag_build_dir("w", at10) != evaluation.synrag_build_dir("w", at3))
  # An option added later, at its off value, names the same build as a config without it.
  older = at10.to_dict()
  del older["generation"]["candidates"], older["generation"]["candidate_terms"]
  assert wd_lib.config_digest(older) == wd_lib.config_digest(at10.to_dict())


def test_dp_rag_takes_questions_with_braces(tmp_path):
  from dpsynrag_jax.baselines import DPRAG  # pylint: disable=g-import-not-at-top
  from dpsynrag_jax.baselines import dp_rag  # pylint: disable=g-import-not-at-top
  from dpsynrag_jax.models import load_encoder, load_lm  # pylint: disable=g-import-not-at-top
  assert "{x} and {{y}}" in dp_rag.answer_template("{x} and {{y}}").format(d="doc")
  config = evaluate_config.get_config("tiny")
  task = evaluation.load_eval_task(config, "medical")
  method = DPRAG(load_lm("tiny-random"), load_encoder("all-minilm-l6-v2"), task,
                 epsilon_total=10.0, num_queries=1, k=4, T=2)
  method.build()
  assert len(method.answer(["What is {my} disease? }{"]).answers) == 1


@pytest.mark.parametrize("dataset", ["movielens", "searchqa"])
def test_the_other_datasets_evaluate_and_funnel_on_generated_fixtures(dataset, tmp_path):
  """The tiny evaluation and the funnel on a generated MovieLens / SearchQA folder (the real
  data is never vendored; its configs read --config.paths.*)."""
  from dpsynrag_jax.data import fixtures  # pylint: disable=g-import-not-at-top
  from dpsynrag_jax.evaluation import funnel  # pylint: disable=g-import-not-at-top
  write = {"movielens": fixtures.write_movielens_fixture,
           "searchqa": fixtures.write_searchqa_fixture}[dataset]
  config = evaluate_config.get_config("tiny")
  config.datasets = dataset
  config.paths[dataset] = write(tmp_path / "data").path
  config.num_documents, config.num_test = 0, 4   # every document of the fixture
  config.methods = "non_rag,rag,dp_synrag,dp_synth,dp_rag"
  rows = evaluate.run(config, str(tmp_path / "eval"))
  assert {r["method"] for r in rows} == {"Non-RAG", "RAG", "DP-SynRAG", "DP-Synth", "DP-RAG"}
  assert all(r["dataset"] == dataset and r["questions"] == 4 for r in rows)
  # The build read its documents from the evaluation: its released config names no local
  # path and the evaluation's cap (0), not the corpus size; the measured size stays private.
  build = next(r["build"] for r in rows if r["method"] == "DP-SynRAG")
  released = json.load(open(tmp_path / "eval" / build / "config.json"))
  assert released["data"]["path"] == "" and released["data"]["num_documents"] == 0
  assert config.paths[dataset] not in open(tmp_path / "eval" / build / "config.json").read()
  (record,) = os.listdir(tmp_path / "eval" / "private" / "data")
  task = evaluation.load_eval_task(config, dataset)
  assert json.load(open(tmp_path / "eval" / "private" / "data" / record))["documents"] == len(
      task.documents)
  # Reproducible benchmarks, and labelled so.
  assert {r["method"]: r.get("noise") for r in rows} == {
      "Non-RAG": None, "RAG": None, "DP-SynRAG": "seeded", "DP-Synth": "seeded",
      "DP-RAG": "seeded"}
  assert json.load(open(tmp_path / "eval" / "results.json"))["note"] == evaluation.BENCHMARK_NOTE
  out = funnel.run(config, str(tmp_path / "eval"))
  by = {s["stage"]: s["value"] for s in out[0]["stages"]}
  assert by["context recall"] <= by["database recall"] and by["coverage"] is not None


def test_the_validation_split_stands_in_for_the_test_questions_without_reading_them():
  """funnel --split=validation: settings chosen on a public benchmark never see its test set."""
  config = evaluate_config.get_config("tiny")
  test = evaluation.load_eval_task(config, "medical")
  validation = evaluation.load_eval_task(config, "medical", "validation")
  assert len(validation.test) == len(test.test) == config.num_test and not validation.validation
  assert validation.documents == test.documents
  assert not {q.subject for q in validation.test} & {q.subject for q in test.test}
  with pytest.raises(ValueError, match="split"):
    evaluation.load_eval_task(config, "medical", "train")


def test_a_movielens_config_refuses_the_other_layout_and_names_the_matching_config(tmp_path):
  """movielens_cpu's settings (674 users, R 83) are for ml-100k; an ml-1m folder gets a pointer
  to movielens_paper instead of a silently wrong experiment."""
  from dpsynrag_jax.data import fixtures  # pylint: disable=g-import-not-at-top
  config = evaluate_config.get_config("movielens_cpu")
  config.paths.movielens = fixtures.write_movielens_fixture(tmp_path / "m1", layout="ml-1m").path
  with pytest.raises(ValueError, match="movielens_paper"):
    evaluation.load_eval_task(config, "movielens")
  config = evaluate_config.get_config("movielens_paper")
  config.paths.movielens = fixtures.write_movielens_fixture(tmp_path / "m100").path
  with pytest.raises(ValueError, match="movielens_cpu"):
    evaluation.load_eval_task(config, "movielens")


def test_publish_copies_the_release_and_rows_but_nothing_private(eval_dir, tmp_path):
  from experiments import publish  # pylint: disable=g-import-not-at-top
  shared, _, rows = eval_dir
  workdir = str(tmp_path / "eval")
  shutil.copytree(shared, workdir)
  # The evaluation artifacts a work dir holds under evaluation/ (stand-ins where this module's
  # leakage and ablation tests did not run first; experiments.funnel writes the funnels).
  reports = [f"funnel_medical_seed0.{ext}" for ext in ("json", "md")]
  reports += list(publish.EVALUATION_REPORTS)
  for name in reports:
    path = artifacts.evaluation_path(workdir, name)
    if not os.path.exists(path):
      if name.endswith(".json"):
        artifacts.write_json(path, {"stand_in": name}, "test", "nothing")
      else:
        artifacts.write_text(path, f"{name}\n", "test", "nothing")
  out = str(tmp_path / "published")
  written = publish.publish(workdir, "medical", out)
  for name in ("synthetic_db.jsonl", "privacy_ledger.json", "config.json", "results.json",
               "table.md"):
    assert name in written and os.path.getsize(os.path.join(out, name)) > 0
  # Evaluation artifacts go to out/evaluation/, as they are, never beside the release.
  for name in reports:
    assert os.path.join("evaluation", name) in written, name
    assert not os.path.exists(os.path.join(out, name)), name
    assert open(os.path.join(out, "evaluation", name), "rb").read() == open(
        artifacts.evaluation_path(workdir, name), "rb").read()
  assert not any(os.path.join("evaluation", name) in written for name in publish.REPORTS)
  assert all(os.path.isfile(os.path.join(out, name)) for name in written)
  build = next(r["build"] for r in rows if r["method"] == "DP-SynRAG")
  assert open(os.path.join(out, "synthetic_db.jsonl"), "rb").read() == open(
      os.path.join(workdir, build, "synthetic_db.jsonl"), "rb").read()
  published = json.load(open(os.path.join(out, "results.json")))["rows"]
  assert {r["method"] for r in published} == {r["method"] for r in rows}
  assert all(not r["examples"] for r in published if r["method"] == "RAG")
  assert any(r["examples"] for r in published if r["method"] == "DP-SynRAG")
  assert not any("private" in name for name in os.listdir(out))
  with pytest.raises(ValueError, match="no rows for dataset"):
    publish.publish(workdir, "searchqa", out)
  _check_restore(publish, eval_dir, out, tmp_path)


def _check_restore(publish, eval_dir, out, tmp_path):
  """The published rows restored into a new work dir: a rerun there computes nothing (no
  build, no answers), and publishing again finds the restored DP-SynRAG row's release in
  --out instead of a build folder."""
  _, config, rows = eval_dir
  new = str(tmp_path / "restored")
  # The shared work dir holds queries-against-accuracy points only when that test ran first.
  expected = {"results.jsonl": len(rows)}
  qva = os.path.join(out, "queries_vs_accuracy.json")
  if os.path.exists(qva):
    expected["queries_vs_accuracy.jsonl"] = len(json.load(open(qva))["rows"])
  assert publish.restore(out, new) == expected
  assert publish.restore(out, new) == {log: 0 for log in expected}   # nothing twice
  again = evaluate.run(config, new)
  assert [r["settings"] for r in again] == [r["settings"] for r in rows]
  # Nothing built or answered; private/ holds only the record of the documents read.
  assert sorted(os.listdir(new)) == sorted(["accuracy.png", "private", "results.json",
                                            "table.md"] + list(expected))
  assert os.listdir(os.path.join(new, "private")) == ["data"]
  publish.publish(new, "medical", out)
  published = json.load(open(os.path.join(out, "results.json")))["rows"]
  assert [r["settings"] for r in published] == [r["settings"] for r in rows]
  with pytest.raises(ValueError, match="neither in the work dir nor published"):
    publish.publish(new, "medical", str(tmp_path / "elsewhere"))
  assert not os.path.exists(tmp_path / "elsewhere")   # refused before anything was written
  other = tmp_path / "other"
  other.mkdir()
  with open(other / "config.json", "w") as f:
    json.dump({**json.load(open(os.path.join(out, "config.json"))), "seed": 99}, f)
  with pytest.raises(ValueError, match="another build"):
    publish.publish(new, "medical", str(other))
  with pytest.raises(FileNotFoundError, match="no published rows"):
    publish.restore(str(tmp_path / "empty"), new)
