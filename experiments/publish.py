"""Copies an evaluation's publishable outputs into docs/results/<name>/.

    python -m experiments.publish --workdir=runs/movielens_cpu/eval --dataset=movielens \
        --out=docs/results/movielens_cpu

What goes out: the DP-SynRAG build's released files (synthetic_db.jsonl, privacy_ledger.json,
config.json; the FAISS index is left out, `rag.index` rebuilds it from the texts), the
evaluation's rows (results.json, table.md) with the example answers of RAG removed (they quote
the private documents), and the aggregate reports the work dir holds (funnel, queries against
accuracy, ablations, leakage). Nothing from private/ is ever copied.
"""

from __future__ import annotations

import json
import os
import shutil

from absl import app
from absl import flags

from dpsynrag_jax.synrag import workdir as wd_lib

FLAGS = flags.FLAGS
# Methods whose example answers may quote private documents verbatim.
QUOTES_PRIVATE = ("RAG",)
BUILD_FILES = (wd_lib.SYNTHETIC_DB, wd_lib.LEDGER, wd_lib.CONFIG)
REPORTS = ("table.md", "queries_vs_accuracy.json", "queries_vs_accuracy.md", "ablations.json",
           "ablations.md", "ablations_funnel.md", "leakage.json", "leakage.md")


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
  """Copies what may be published for `dataset` from the evaluation in `workdir` to `out`;
  returns the files written."""
  results_path = os.path.join(workdir, "results.json")
  if not os.path.exists(results_path):
    raise FileNotFoundError(f"{results_path} is missing: run experiments.evaluate first.")
  with open(results_path, encoding="utf-8") as f:
    results = json.load(f)
  rows = [r for r in results["rows"] if r["dataset"] == dataset]
  if not rows:
    raise ValueError(f"{results_path} holds no rows for dataset {dataset!r}.")
  os.makedirs(out, exist_ok=True)
  written = []
  synrag = [r for r in rows if r["method"] == "DP-SynRAG" and r.get("build")]
  if synrag:
    build = os.path.join(workdir, synrag[0]["build"])
    if not wd_lib.Workdir(build).finished:
      raise ValueError(f"{build} is not a finished build.")
    for name in BUILD_FILES:
      shutil.copyfile(os.path.join(build, name), os.path.join(out, name))
      written.append(name)
  summary = [s for s in results.get("summary", []) if s.get("dataset") == dataset]
  wd_lib.atomic_write_json(os.path.join(out, "results.json"),
                           {"rows": publishable_rows(rows), "summary": summary})
  written.append("results.json")
  for name in [f"funnel_{dataset}_seed{r['seed']}.{ext}" for r in synrag
               for ext in ("json", "md")] + list(REPORTS):
    path = os.path.join(workdir, name)
    if os.path.exists(path):
      shutil.copyfile(path, os.path.join(out, name))
      written.append(name)
  return written


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  for name in publish(FLAGS.workdir, FLAGS.dataset, FLAGS.out):
    print(os.path.join(FLAGS.out, name))


if __name__ == "__main__":
  flags.DEFINE_string("workdir", None, "The evaluation's work dir.")
  flags.DEFINE_string("dataset", None, "medical, movielens or searchqa.")
  flags.DEFINE_string("out", None, "Destination, e.g. docs/results/movielens_cpu.")
  flags.mark_flags_as_required(["workdir", "dataset", "out"])
  app.run(main)
