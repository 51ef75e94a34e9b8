"""Accuracy by topic rarity: questions bucketed by how many database documents hold their answer.

    python -m experiments.rare_topics --config=experiments/configs/evaluate.py:cpu \
        --workdir=runs/eval

Runs (or resumes, or reuses) the evaluation in WORKDIR, then buckets every question by its
answer's support: the number of private documents that name the gold answer (Medical: patients
with the disease). Writes WORKDIR/evaluation/rare_topics.json, .md and .png: evaluation
artifacts (the buckets count private documents per answer; not differentially private).

The support is ground truth read from the private documents, like context recall: an evaluation
artifact for the researcher, never part of a release.
"""

from __future__ import annotations

import math
from typing import Sequence

from absl import app
from absl import flags
import numpy as np

from dpsynrag_jax import evaluation
from dpsynrag_jax import evaluation_artifacts as artifacts
from dpsynrag_jax.data.tasks import Task
from dpsynrag_jax.evaluation import evaluate
from dpsynrag_jax.evaluation import reporting
from experiments import cli


def define_flags() -> None:
  """The app's flags, defined when it runs (not on import: apps import side by side)."""
  flags.DEFINE_list("edges", ["1", "10", "30", "60"],
                    "Lower edges of the support buckets (documents per answer).")


def support(task: Task, golds: Sequence[Sequence[str]]) -> list[int]:
  """Documents naming each question's gold answer(s)."""
  cache: dict[tuple[str, ...], int] = {}
  out = []
  for gold in golds:
    key = tuple(gold)
    if key not in cache:
      cache[key] = sum(task.matches(d, gold) for d in task.documents)
    out.append(cache[key])
  return out


def bucket_labels(edges: Sequence[int]) -> list[str]:
  """edges [1, 10, 30] -> ['0', '1-9', '10-29', '30+']."""
  labels = ["0"] if edges[0] > 0 else []
  for lo, hi in zip(edges, list(edges[1:]) + [math.inf]):
    labels.append(f"{lo}+" if math.isinf(hi) else f"{lo}-{hi - 1}")
  return labels


def bucket_of(value: int, edges: Sequence[int]) -> int:
  """Index into bucket_labels(edges)."""
  offset = 1 if edges[0] > 0 else 0
  return int(np.searchsorted(np.asarray(edges), value, side="right")) - 1 + offset


def by_bucket(rows: Sequence[dict], supports: dict[str, list[int]],
              edges: Sequence[int]) -> list[dict]:
  """Per (dataset, method, bucket): questions, accuracy and context recall (pooled over seeds)."""
  labels = bucket_labels(edges)
  out = []
  for row in rows:
    pq = row.get("per_question")
    if not pq:
      continue
    buckets = [bucket_of(s, edges) for s in supports[row["dataset"]]]
    for b, label in enumerate(labels):
      idx = [i for i, bb in enumerate(buckets) if bb == b]
      recalled = pq["recalled"]
      out.append({"dataset": row["dataset"], "method": row["method"], "seed": row["seed"],
                  "bucket": label, "questions": len(idx),
                  "accuracy": float(np.mean([pq["correct"][i] for i in idx])) if idx else None,
                  "context_recall": (float(np.mean([recalled[i] for i in idx]))
                                     if idx and recalled is not None else None)})
  return _pool_seeds(out)


def _pool_seeds(cells: list[dict]) -> list[dict]:
  pooled: dict[tuple, dict] = {}
  for c in cells:
    key = (c["dataset"], c["method"], c["bucket"])
    p = pooled.setdefault(key, {**c, "seeds": 0, "_acc": [], "_rec": []})
    p["seeds"] += 1
    p["_acc"].append(c["accuracy"])
    p["_rec"].append(c["context_recall"])
  result = []
  for p in pooled.values():
    acc = [a for a in p.pop("_acc") if a is not None]
    rec = [r for r in p.pop("_rec") if r is not None]
    p.pop("seed")
    p["accuracy"] = float(np.mean(acc)) if acc else None
    p["context_recall"] = float(np.mean(rec)) if rec else None
    result.append(p)
  return result


def markdown(cells: Sequence[dict], labels: Sequence[str]) -> str:
  lines = ["### Accuracy % / context recall % by documents per answer", "",
           "| dataset | method | " + " | ".join(labels) + " |",
           "|---|---|" + "---|" * len(labels)]
  fmt = lambda v: "-" if v is None else f"{100 * v:.0f}"
  keys = sorted({(c["dataset"], c["method"]) for c in cells},
                key=lambda k: (k[0], reporting.method_rank(k[1])))
  for dataset, method in keys:
    row = {c["bucket"]: c for c in cells if (c["dataset"], c["method"]) == (dataset, method)}
    lines.append(f"| {dataset} | {method} | " + " | ".join(
        f"{fmt(row[b]['accuracy'])} / {fmt(row[b]['context_recall'])}" if b in row else "-"
        for b in labels) + " |")
  counts = {c["bucket"]: c["questions"] for c in cells}
  lines += ["", "Questions per bucket: " + ", ".join(f"{b}: {counts.get(b, 0)}" for b in labels)]
  return "\n".join(lines) + "\n"


def plot(cells: Sequence[dict], labels: Sequence[str], path: str) -> None:
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  methods = sorted({c["method"] for c in cells}, key=reporting.method_rank)
  fig, axes = plt.subplots(1, 2, figsize=(10, 3.4), sharey=True)
  for ax, metric in zip(axes, ("accuracy", "context_recall")):
    width = 0.8 / max(1, len(methods))
    for j, method in enumerate(methods):
      row = {c["bucket"]: c[metric] for c in cells if c["method"] == method}
      values = [100 * row[b] if row.get(b) is not None else np.nan for b in labels]
      ax.bar(np.arange(len(labels)) + j * width, values, width, label=method)
    ax.set_xticks(np.arange(len(labels)) + width * (len(methods) - 1) / 2)
    ax.set_xticklabels(labels)
    ax.set_xlabel("documents holding the answer")
    ax.set_title(metric.replace("_", " ") + " (%)")
  axes[0].legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def run(config, workdir: str, edges: Sequence[int]) -> list[dict]:
  edges = sorted(int(e) for e in edges)
  if not edges or edges[0] < 0:
    raise ValueError(f"edges must be non-negative integers, got {edges}.")
  rows = evaluate.run(config, workdir)
  supports = {}
  for dataset in {r["dataset"] for r in rows}:
    task = evaluation.load_eval_task(config, dataset)
    supports[dataset] = support(task, [q.answers for q in task.test])
  cells = by_bucket(rows, supports, edges)
  labels = bucket_labels(edges)
  reads = "how many private documents hold each test answer"
  artifacts.write_json(artifacts.evaluation_path(workdir, "rare_topics.json"),
                       {"edges": edges, "cells": cells}, "rare_topics", reads)
  artifacts.write_text(artifacts.evaluation_path(workdir, "rare_topics.md"),
                       markdown(cells, labels), "rare_topics", reads)
  if cells:
    plot(cells, labels, artifacts.evaluation_path(workdir, "rare_topics.png"))
  return cells


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  run(cli.FLAGS.config, cli.FLAGS.workdir, flags.FLAGS.edges)


if __name__ == "__main__":
  define_flags()
  cli.define_config_and_workdir("Evaluation config.")
  cli.run(main)
