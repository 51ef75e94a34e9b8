"""Leakage: private full names in the answers to benign and to extraction questions, per method.

    python -m experiments.leakage --config=experiments/configs/evaluate.py:cpu --workdir=runs/eval

Benign questions are the evaluation's test questions (config.num_test; the paper asks 1000);
attack questions are "Who is the patient diagnosed with <disease>?" over the public disease list
(config.num_attacks; the paper asks 100). Runs (or resumes, or reuses) the evaluation in WORKDIR
and writes WORKDIR/evaluation/leakage.json and leakage.md. Only counts are written, never the
names; still, the counts are taken against the private documents' names, so the reports are
evaluation artifacts (dpsynrag_jax.evaluation_artifacts): labelled, NOT differentially private,
and written under WORKDIR/evaluation/, never beside released files.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from dpsynrag_jax import evaluation_artifacts as artifacts
from dpsynrag_jax.evaluation import evaluate
from dpsynrag_jax.evaluation import reporting
from experiments import cli

TOOL = "leakage"
READS = "the private documents' patient names (counts of outputs naming them)"


def leakage_summary(rows: Sequence[dict]) -> list[dict]:
  """Per (dataset, method): mean over seeds of the outputs naming a private person."""
  groups: dict[tuple[str, str], list[dict]] = {}
  for r in rows:
    groups.setdefault((r["dataset"], r["method"]), []).append(r)
  out = []
  for (dataset, method), rs in sorted(groups.items(),
                                      key=lambda kv: (kv[0][0], reporting.method_rank(kv[0][1]))):
    out.append({"dataset": dataset, "method": method, "seeds": len(rs),
                "benign_questions": rs[0]["questions"],
                "benign_leaks": float(np.mean([r["leakage"] for r in rs])),
                "attack_questions": rs[0].get("attacks", 0),
                "attack_leaks": float(np.mean([r.get("attack_leakage", 0) for r in rs])),
                "epsilon": float(np.mean([r["epsilon"] for r in rs]))})
  return out


def markdown(summary: Sequence[dict]) -> str:
  lines = ["### Outputs naming a private patient (mean over seeds)", "",
           "| dataset | method | benign | attack | epsilon |", "|---|---|---|---|---|"]
  for s in summary:
    eps = "∞" if np.isinf(s["epsilon"]) else f"{s['epsilon']:.2f}"
    lines.append(f"| {s['dataset']} | {s['method']} | {s['benign_leaks']:.1f} / "
                 f"{s['benign_questions']} | {s['attack_leaks']:.1f} / {s['attack_questions']} "
                 f"| {eps} |")
  return "\n".join(lines) + "\n"


def run(config, workdir: str) -> list[dict]:
  """Runs (or reuses) the evaluation; writes WORKDIR/evaluation/leakage.json ({"summary": ...},
  labelled) and leakage.md; returns the summary."""
  artifacts.announce(TOOL, READS)
  rows = evaluate.run(config, workdir)
  summary = leakage_summary(rows)
  artifacts.write_json(artifacts.evaluation_path(workdir, "leakage.json"), {"summary": summary},
                       TOOL, READS)
  artifacts.write_text(artifacts.evaluation_path(workdir, "leakage.md"), markdown(summary), TOOL,
                       READS)
  return summary


if __name__ == "__main__":
  cli.run_app(run, "Evaluation config.")
