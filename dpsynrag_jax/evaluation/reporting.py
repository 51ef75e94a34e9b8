"""Result rows -> results.json, a markdown table and a bar plot (shared by the experiment apps)."""

from __future__ import annotations

import collections
import json
import math
import os
from typing import Sequence

import numpy as np

METHOD_ORDER = ("Non-RAG", "RAG", "DP-SynRAG", "DP-Synth", "DP-RAG", "Aug-PE")


def method_rank(method: str) -> int:
  """Position in METHOD_ORDER (unknown names last), for sorting tables and legends."""
  return METHOD_ORDER.index(method) if method in METHOD_ORDER else len(METHOD_ORDER)


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
  values = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
  if not values:
    return float("nan"), float("nan")
  return float(np.mean(values)), float(np.std(values))


def _fmt(mean: float, std: float, scale: float = 100.0) -> str:
  if math.isnan(mean):
    return "-"
  return f"{scale * mean:.1f} ± {scale * std:.1f}"


def _fmt_eps(values: Sequence[float]) -> str:
  mean = float(np.mean(values))
  return "∞" if math.isinf(mean) else f"{mean:.2f}"


def aggregate(rows: Sequence[dict]) -> list[dict]:
  """One summary per (dataset, method): mean and std over seeds."""
  groups = collections.defaultdict(list)
  for r in rows:
    groups[(r["dataset"], r["method"])].append(r)
  out = []
  for (dataset, method), rs in sorted(groups.items(),
                                      key=lambda kv: (kv[0][0], method_rank(kv[0][1]))):
    acc = _mean_std([r["accuracy"] for r in rs])
    rec = _mean_std([r["context_recall"] for r in rs])
    out.append({"dataset": dataset, "method": method, "seeds": len(rs),
                "accuracy_mean": acc[0], "accuracy_std": acc[1],
                "context_recall_mean": rec[0], "context_recall_std": rec[1],
                "leakage_mean": float(np.mean([r["leakage"] for r in rs])),
                "epsilon": float(np.mean([r["epsilon"] for r in rs])),
                "questions": rs[0]["questions"]})
  return out


def markdown_table(summary: Sequence[dict], title: str) -> str:
  lines = [f"### {title}", "",
           "| dataset | method | accuracy % | context recall % | leakage | epsilon | seeds |",
           "|---|---|---|---|---|---|---|"]
  for s in summary:
    lines.append(
        f"| {s['dataset']} | {s['method']} | {_fmt(s['accuracy_mean'], s['accuracy_std'])} | "
        f"{_fmt(s['context_recall_mean'], s['context_recall_std'])} | "
        f"{s['leakage_mean']:.1f} / {s['questions']} | {_fmt_eps([s['epsilon']])} | "
        f"{s['seeds']} |")
  return "\n".join(lines) + "\n"


def bar_plot(summary: Sequence[dict], path: str, metric: str = "accuracy") -> None:
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  datasets = sorted({s["dataset"] for s in summary})
  methods = [m for m in METHOD_ORDER if any(s["method"] == m for s in summary)]
  width = 0.8 / max(1, len(datasets))
  fig, ax = plt.subplots(figsize=(1.2 + 1.1 * len(methods), 3.2))
  for j, dataset in enumerate(datasets):
    by_method = {s["method"]: s for s in summary if s["dataset"] == dataset}
    means = [100 * by_method[m][f"{metric}_mean"] if m in by_method else 0 for m in methods]
    stds = [100 * by_method[m][f"{metric}_std"] if m in by_method else 0 for m in methods]
    ax.bar(np.arange(len(methods)) + j * width, np.nan_to_num(means), width,
           yerr=np.nan_to_num(stds), label=dataset, capsize=3)
  ax.set_xticks(np.arange(len(methods)) + width * (len(datasets) - 1) / 2)
  ax.set_xticklabels(methods, rotation=15)
  ax.set_ylabel(f"{metric.replace('_', ' ')} (%)")
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def write_tables(rows: Sequence[dict], workdir: str, title: str,
                 note: str | None = None) -> list[dict]:
  """results.json (rows, summary and `note`, if any), table.md (the note under the table),
  accuracy.png; returns the summary."""
  summary = aggregate(rows)
  results = {"rows": list(rows), "summary": summary}
  if note:
    results["note"] = note
  with open(os.path.join(workdir, "results.json"), "w", encoding="utf-8") as f:
    json.dump(results, f, indent=1)
  with open(os.path.join(workdir, "table.md"), "w", encoding="utf-8") as f:
    f.write(markdown_table(summary, title) + (f"\n{note}\n" if note else ""))
  if summary:
    bar_plot(summary, os.path.join(workdir, "accuracy.png"))
  return summary
