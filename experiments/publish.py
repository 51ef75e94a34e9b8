"""Copies an evaluation's publishable outputs into docs/results/<name>/.

    python -m experiments.publish --workdir=runs/movielens_cpu/eval --dataset=movielens \
        --out=docs/results/movielens_cpu

What goes out, at the top of --out: the DP-SynRAG build's released files (synthetic_db.jsonl,
privacy_ledger.json, config.json; the FAISS index is left out, `rag.index` rebuilds it from the
texts), the evaluation's rows (results.json, table.md) with the example answers of RAG removed
(they quote the private documents), and the queries-against-accuracy points
(queries_vs_accuracy.json, .md). Under --out/evaluation/: the evaluation artifacts the work dir
holds under WORKDIR/evaluation/ (dpsynrag_jax.evaluation_artifacts), reports that read private
state and are NOT differentially private: the DP-SynRAG build's funnel
(funnel_<dataset>_seed<seed>.json, .md), the ablations (ablations.json, .md, ablations_funnel.md:
each variant's funnel) and leakage (leakage.json, .md: counts of outputs naming a private
person). Publish them only for a public benchmark corpus. Nothing from private/ is ever copied.

    python -m experiments.publish --restore --workdir=runs/searchqa_cpu/eval --dataset=searchqa \
        --out=docs/results/searchqa_cpu

--restore goes the other way, for a new machine: the published rows are appended to the work
dir's results.jsonl (and published queries-against-accuracy points to its
queries_vs_accuracy.jsonl), so a rerun of the same evaluation there computes only what is
missing. A restored DP-SynRAG row's build stays where it was published: publishing again
checks that the build named by the row is the one in --out (its config digest) instead of
copying it.

--pages regenerates every results page (docs/results/<name>/README.md, from its page.json and
the JSON beside it) and the results table in README.md between its markers
(dpsynrag_jax.results_pages); with --check it writes nothing and exits non-zero naming the pages
that differ from what the JSON regenerates:

    python -m experiments.publish --pages [--check]
"""

from __future__ import annotations

import json
import os
import shutil

from absl import app
from absl import flags

from dpsynrag_jax import evaluation_artifacts as artifacts
from dpsynrag_jax import results_pages
from dpsynrag_jax.synrag import workdir as wd_lib

FLAGS = flags.FLAGS
# Methods whose example answers may quote private documents verbatim.
QUOTES_PRIVATE = ("RAG",)
BUILD_FILES = (wd_lib.SYNTHETIC_DB, wd_lib.LEDGER, wd_lib.CONFIG)
# Reports published beside the release (the rows' tables and points).
REPORTS = ("table.md", "queries_vs_accuracy.json", "queries_vs_accuracy.md")
# Evaluation artifacts (they read private state: funnels, counts of private names), copied from
# WORKDIR/evaluation/ to OUT/evaluation/; the funnels of the DP-SynRAG builds go there too.
EVALUATION_REPORTS = ("ablations.json", "ablations.md", "ablations_funnel.md", "leakage.json",
                      "leakage.md")


def publishable_rows(rows: list[dict]) -> list[dict]:
  """The rows with the example answers of QUOTES_PRIVATE methods dropped."""
  out = []
  for row in rows:
    row = dict(row)
    if row.get("method") in QUOTES_PRIVATE:
      row["examples"], row["attack_examples"] = [], []
    out.append(row)
  return out


def publish(workdir: str, dataset: str, out: str) -> list[str]:
  """Copies what may be published for `dataset` from the evaluation in `workdir` to `out`
  (evaluation artifacts to out/evaluation/); returns the files written, relative to `out`."""
  results_path = os.path.join(workdir, "results.json")
  if not os.path.exists(results_path):
    raise FileNotFoundError(f"{results_path} is missing: run experiments.evaluate first.")
  with open(results_path, encoding="utf-8") as f:
    results = json.load(f)
  rows = [r for r in results["rows"] if r["dataset"] == dataset]
  if not rows:
    raise ValueError(f"{results_path} holds no rows for dataset {dataset!r}.")
  written = []
  synrag = [r for r in rows if r["method"] == "DP-SynRAG" and r.get("build")]
  build = os.path.join(workdir, synrag[0]["build"]) if synrag else None
  # Every check before the first write: a refused publish leaves no empty --out behind.
  if build and not os.path.isdir(build):
    _check_published_build(out, synrag[0]["build"])   # a restored row: its release is in out
  elif build and not wd_lib.Workdir(build).finished:
    raise ValueError(f"{build} is not a finished build.")
  if build and os.path.isdir(build):
    _check_names_no_path(build)
  os.makedirs(out, exist_ok=True)
  if build and os.path.isdir(build):
    for name in BUILD_FILES:
      shutil.copyfile(os.path.join(build, name), os.path.join(out, name))
      written.append(name)
  summary = [s for s in results.get("summary", []) if s.get("dataset") == dataset]
  published = {"rows": publishable_rows(rows), "summary": summary}
  if results.get("note"):
    published["note"] = results["note"]
  wd_lib.atomic_write_json(os.path.join(out, "results.json"), published)
  written.append("results.json")
  for name in REPORTS:
    path = os.path.join(workdir, name)
    if os.path.exists(path):
      shutil.copyfile(path, os.path.join(out, name))
      written.append(name)
  funnels = [f"funnel_{dataset}_seed{r['seed']}.{ext}" for r in synrag for ext in ("json", "md")]
  for name in funnels + list(EVALUATION_REPORTS):
    path = artifacts.evaluation_path(workdir, name)
    if os.path.exists(path):
      dest = artifacts.check_destination(artifacts.evaluation_path(out, name))
      os.makedirs(os.path.dirname(dest), exist_ok=True)
      shutil.copyfile(path, dest)
      written.append(os.path.join(artifacts.EVALUATION, name))
  return written


def _check_names_no_path(build: str) -> None:
  """Raises if the build's released config names a local data path (evaluation builds made
  before the evaluation handed the build its documents recorded the folder they read)."""
  with open(os.path.join(build, wd_lib.CONFIG), encoding="utf-8") as f:
    path = json.load(f).get("data", {}).get("path", "")
  if path:
    raise ValueError(f"{build}/{wd_lib.CONFIG} names the local path {path!r}; a published "
                     "config must not. Rebuild with the current evaluation, which hands the "
                     "build its documents instead.")


def _check_published_build(out: str, build: str) -> None:
  """Raises unless `out` holds the release of `build` (a build folder ends with its config
  digest)."""
  path = os.path.join(out, wd_lib.CONFIG)
  if not os.path.exists(path):
    raise ValueError(f"The DP-SynRAG build {build} is neither in the work dir nor published "
                     f"in {out}.")
  with open(path, encoding="utf-8") as f:
    digest = wd_lib.config_digest(json.load(f))
  if not build.endswith("_" + digest):
    raise ValueError(f"{out} holds the release of another build (config digest {digest}) "
                     f"than the rows' {build}.")


def restore(out: str, workdir: str) -> dict:
  """Appends the rows published in `out` to `workdir`'s results.jsonl and
  queries_vs_accuracy.jsonl, skipping those already there (by settings key); returns how many
  rows each file received."""
  os.makedirs(workdir, exist_ok=True)
  added = {}
  for published, log in (("results.json", "results.jsonl"),
                         ("queries_vs_accuracy.json", "queries_vs_accuracy.jsonl")):
    path = os.path.join(out, published)
    if not os.path.exists(path):
      continue
    with open(path, encoding="utf-8") as f:
      rows = json.load(f)["rows"]
    log_path = os.path.join(workdir, log)
    have = {r.get("settings") for r in wd_lib.read_jsonl(log_path)}
    new = [r for r in rows if r.get("settings") and r["settings"] not in have]
    wd_lib.append_jsonl(log_path, new)
    added[log] = len(new)
  if not added:
    raise FileNotFoundError(f"{out} holds no published rows (results.json, "
                            "queries_vs_accuracy.json).")
  return added


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if FLAGS.pages:
    given = [f"--{name}" for name in ("workdir", "dataset", "out", "restore")
             if FLAGS[name].present]
    if given:
      raise app.UsageError(f"--pages takes no {', '.join(given)}: it reads docs/results.")
    if FLAGS.check:
      differ = results_pages.stale()
      for path in differ:
        print(f"{os.path.relpath(path)} differs from what its JSON regenerates")
      if differ:
        raise SystemExit("Run python -m experiments.publish --pages to regenerate them.")
      return
    for path in results_pages.write():
      print(os.path.relpath(path))
    return
  if FLAGS.check:
    raise app.UsageError("--check goes with --pages.")
  missing = [f"--{name}" for name in ("workdir", "dataset", "out") if FLAGS[name].value is None]
  if missing:
    raise app.UsageError(f"{', '.join(missing)} required (or --pages).")
  if FLAGS.restore:
    for log, count in restore(FLAGS.out, FLAGS.workdir).items():
      print(f"{os.path.join(FLAGS.workdir, log)}: {count} rows restored")
    return
  for name in publish(FLAGS.workdir, FLAGS.dataset, FLAGS.out):
    print(os.path.join(FLAGS.out, name))


if __name__ == "__main__":
  flags.DEFINE_string("workdir", None, "The evaluation's work dir.")
  flags.DEFINE_string("dataset", None, "medical, movielens or searchqa.")
  flags.DEFINE_string("out", None, "Destination, e.g. docs/results/movielens_cpu.")
  flags.DEFINE_bool("restore", False, "Copy the rows published in --out back into --workdir "
                    "(a rerun there then computes only the missing rows).")
  flags.DEFINE_bool("pages", False, "Regenerate the results pages and README's results table "
                    "from the committed JSON instead (no other flag).")
  flags.DEFINE_bool("check", False, "With --pages: write nothing; exit non-zero naming the "
                    "pages that differ.")
  app.run(main)
