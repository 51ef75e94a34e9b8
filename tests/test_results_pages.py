"""The results pages under docs/results are what their committed JSON regenerates."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from dpsynrag_jax import results_pages as rp

PAGES = ("accountants", "beyond_10", "beyond_3", "beyond_5", "beyond_5/topic_T30",
         "beyond_sample", "discovered_10", "discovered_3", "discovered_5", "movielens_cpu",
         "movielens_terms", "paper_cpu", "searchqa_cpu", "searchqa_terms")


def test_every_results_page_is_generated():
  readmes = sorted(os.path.relpath(d, rp.RESULTS_DIR).replace(os.sep, "/")
                   for d, _, files in os.walk(rp.RESULTS_DIR) if rp.PAGE in files)
  assert rp.page_folders() == sorted(PAGES)
  assert readmes == sorted(PAGES)


def test_committed_pages_are_what_their_json_regenerates():
  """Fails when a page was edited by hand or its JSON changed without
  `python -m experiments.publish --pages`."""
  assert [os.path.relpath(p, rp.REPO) for p in rp.stale(readme=None)] == []


def test_pages_hold_one_date_at_most_and_no_issue_numbers():
  for path, text in rp.generate(readme=None).items():
    dated = [line for line in text.splitlines() if re.search(r"\d{4}-\d{2}-\d{2}", line)]
    assert all(line.startswith("Measured on ") for line in dated), path
    assert len(dated) <= 1, path
    assert not re.search(r"\bsession|\bissue \d|#\d", text, re.IGNORECASE), path


def _copy_json(tmp_path) -> str:
  """docs/results with its JSON and page sources only (no released texts)."""
  out = str(tmp_path / "results")
  shutil.copytree(rp.RESULTS_DIR, out,
                  ignore=lambda d, names: [n for n in names if n.endswith((".jsonl", ".md"))])
  return out


def _edit(path, change):
  with open(path, encoding="utf-8") as f:
    data = json.load(f)
  change(data)
  with open(path, "w", encoding="utf-8") as f:
    json.dump(data, f)


def test_a_changed_number_changes_the_pages_it_feeds(tmp_path):
  results = _copy_json(tmp_path)
  before = rp.generate(results, readme=None)
  table_before = rp.results_table(results)

  def recall(funnel):
    stage, = [s for s in funnel["stages"] if s["stage"] == "context recall"]
    assert stage["value"] == 0.88
    stage["value"] = 0.91
  _edit(os.path.join(results, "beyond_5", "evaluation", "funnel.json"), recall)
  after = rp.generate(results, readme=None)
  changed = sorted(os.path.relpath(p, results) for p in after if after[p] != before[p])
  # beyond_5's own page quotes no funnel figure; topic_T30's compares against it.
  assert changed == [os.path.join("beyond_5", "topic_T30", rp.PAGE)]
  page = " ".join(after[os.path.join(results, "beyond_5", "topic_T30", rp.PAGE)].split())
  assert "91 % for the openings-only build" in page and "88 %" not in page
  table = rp.results_table(results)
  assert table != table_before and "| 91.0 % |" in table

  def documents(config):
    config["data"]["num_documents"] = 7999
  _edit(os.path.join(results, "paper_cpu", "config.json"), documents)
  page = rp.render_page("paper_cpu", results)
  assert page.splitlines()[3] == "# paper_cpu: the paper's settings on all 7999 Medical notes"
  assert rp.stale(results, readme=None)   # nothing was written to the copy


def test_a_number_typed_in_a_page_source_is_refused(tmp_path):
  results = _copy_json(tmp_path)
  for typed, found in (("context recall 88 % at eps 5", "88"), ("on 2026-12-03", "2026"),
                       ("a work session note", "session"), ("on two builds", "two")):
    _edit(os.path.join(results, "beyond_5", rp.PAGE_SOURCE),
          lambda page, typed=typed: page["blocks"].append(typed))
    with pytest.raises(ValueError, match=found):
      rp.render_page("beyond_5", results)
    _edit(os.path.join(results, "beyond_5", rp.PAGE_SOURCE), lambda page: page["blocks"].pop())
  # Code spans, links, references and names are not figures.
  assert rp.typed_figures("`--epsilons=3,5,10` [a](../x2.md) Table 6, SmolLM2-135M, top-10, "
                          "{funnel[accuracy]:.0%}") == []


def test_results_table_rows_come_from_the_json():
  table = rp.results_table()
  rows = [line.split(" | ") for line in table.splitlines()[2:]]
  assert [r[2] for r in rows if r[1] == "DP-SynRAG" and "paper_cpu" in r[5]] == ["10"]
  with open(os.path.join(rp.RESULTS_DIR, "paper_cpu", "results.json"), encoding="utf-8") as f:
    summary = {s["method"]: s for s in json.load(f)["summary"]}
  paper = [r for r in rows if "(docs/results/paper_cpu/" in r[5]]
  assert [r[1] for r in paper] == ["DP-SynRAG", "DP-RAG", "DP-Synth", "Non-RAG", "RAG"]
  for r in paper:
    assert r[3] == f"{100 * summary[r[1]]['accuracy_mean']:.1f} %"
  assert [r[2] for r in rows if "openings only (" in r[1]] == ["3", "5", "10"]
  assert [r[2] for r in rows if "openings only, discovered terms" in r[1]] == [
      "3", "5", "10", "10", "10"]
  assert {r[0].lstrip("| ") for r in rows} == {"Medical Synth", "MovieLens", "SearchQA"}
  for r in rows:
    link = re.search(r"\]\((.*)\)", r[5]).group(1)
    assert os.path.exists(os.path.join(rp.REPO, link)), link


def test_pages_put_the_table_between_the_readme_markers(tmp_path):
  results = str(tmp_path / "results")   # the JSON without page sources: only the README
  shutil.copytree(rp.RESULTS_DIR, results,
                  ignore=lambda d, names: [n for n in names if n.endswith((".jsonl", ".md"))
                                           or n == rp.PAGE_SOURCE])
  readme = tmp_path / "README.md"
  readme.write_text("# x\n\nAbove.\n\n" + rp.README_START + "\nold rows\n" + rp.README_END +
                    "\n\nBelow.\n", encoding="utf-8")
  assert rp.stale(results, str(readme)) == [str(readme)]
  assert rp.write(results, str(readme)) == [str(readme)]
  text = readme.read_text(encoding="utf-8")
  assert text == ("# x\n\nAbove.\n\n" + rp.README_START + "\n" + rp.results_table(results) +
                  "\n" + rp.README_END + "\n\nBelow.\n")
  assert rp.stale(results, str(readme)) == []
  readme.write_text("# x\n\nno markers yet\n", encoding="utf-8")
  assert rp.generate(results, str(readme)) == {}
  readme.write_text(rp.README_END + rp.README_START, encoding="utf-8")
  with pytest.raises(ValueError, match="once"):
    rp.generate(results, str(readme))


def test_figure_formats():
  assert f"{rp.Figure(0.001):sci}" == "1e-3"
  assert f"{rp.Figure(0.8823):.0%}" == "88 %" and f"{rp.Figure(0.0):+.1%}" == "+0.0 %"
  assert f"{rp.Figure(float('inf')):.4g}" == "∞" and f"{rp.Figure(float('nan')):.1%}" == "-"
  assert f"{rp.Figure(9.999999999999998):g}" == "10"
  assert f"{rp.Count(1):w seed}" == "one seed" and f"{rp.Count(5):w}" == "five"
  assert f"{rp.Count(2):w seed}" == "two seeds" and f"{rp.Count(85):w}" == "85"


def test_the_generator_imports_no_jax():
  code = "import sys, dpsynrag_jax.results_pages; assert 'jax' not in sys.modules"
  subprocess.run([sys.executable, "-c", code], check=True, cwd=rp.REPO)
