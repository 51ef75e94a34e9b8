"""Methods x datasets x seeds: accuracy, context recall, leakage and epsilon (Table 1).

    python -m experiments.evaluate --config=experiments/configs/evaluate.py:cpu --workdir=runs/eval

Writes WORKDIR/results.jsonl (one row per dataset, method, seed and method settings, appended as
each finishes, so a rerun skips finished rows), results.json, table.md and accuracy.png. A row is
keyed by a digest of everything that decides its result (`method_settings`): a rerun with other
settings in the same work dir computes new rows, and the tables show the current settings'
rows only. DP-SynRAG builds go to WORKDIR/dp_synrag/<dataset>_seed<s>_<config digest>/ and are
shared by every app run in the same work dir with an equal pipeline config. Answers are logged
every 10 questions to WORKDIR/private/answers/<row key>/ (they hold the texts each answer saw),
so a rerun after a crash continues inside a method too, with the same answers and keys.

Rows are keyed by public settings only (no corpus size, no local path); what was read for each
dataset is recorded under WORKDIR/private/data/ (evaluation.check_eval_data). Every noisy
method draws seeded noise (evaluation.NOISE): the rows are reproducible benchmarks, and say so.
"""

from __future__ import annotations

import os

from dpsynrag_jax import privacy
from dpsynrag_jax.evaluation import METHOD_NAMES
from dpsynrag_jax.evaluation import evaluate
from dpsynrag_jax.synrag import workdir as wd_lib
from experiments import cli


def sweep_rows(config, workdir: str) -> list[dict]:
  """A finished run's rows for launch.sweep's tables: scores, and for DP-SynRAG the epsilon
  read back from its build's privacy ledger."""
  del config  # a sweep point's work dir holds its own rows
  rows = []
  for row in wd_lib.read_jsonl(os.path.join(workdir, "results.jsonl")):
    out = {k: v for k, v in row.items()
           if "examples" not in k and k not in ("per_question", "settings", "build")}
    if row["method"] == METHOD_NAMES["dp_synrag"] and "build" in row:
      ledger = privacy.PrivacyLedger.load(os.path.join(workdir, row["build"], wd_lib.LEDGER))
      out["ledger_eps_closed_form"] = ledger.spent_epsilon("closed_form")
      out["ledger_eps_rdp"] = ledger.spent_epsilon("rdp")
    rows.append(out)
  return rows


if __name__ == "__main__":
  cli.run_app(evaluate.run, "Evaluation config.")
