"""DP-SynRAG with one component removed at a time, side by side with the full method.

    python -m experiments.ablations --config=experiments/configs/ablations.py:cpu --workdir=runs/eval

Writes WORKDIR/ablations.jsonl (one row per variant and seed; a rerun skips finished rows),
ablations.json and ablations.md. Builds go to WORKDIR/dp_synrag/<dataset>_<variant>_seed<s>; the
full method's build is the evaluation's, so running this in the evaluation's work dir reuses it.
"""

from __future__ import annotations

import json
import os
from typing import Sequence

from absl import app
from absl import flags
from absl import logging
import numpy as np

from dpsynrag_jax.synrag import workdir as wd_lib
from experiments import cli
from experiments import evaluate


VARIANTS = ("full", "no_rerank", "no_self_filter", "self_filter", "hard", "synonyms")


def variant_config(base, variant: str):
  """The pipeline config of one variant (a copy of `base` with one switch changed)."""
  if variant not in VARIANTS:
    raise ValueError(f"Unknown variant {variant!r}; expected one of {VARIANTS}.")
  c = base.copy_and_resolve_references()
  c.unlock()
  if variant == "no_rerank":
    c.clustering.rerank = False
  elif variant == "no_self_filter":
    c.self_filter.enabled = False
  elif variant == "self_filter":
    c.self_filter.enabled = True
  elif variant == "hard":
    c.clustering.L = 1
  elif variant == "synonyms":
    c.clustering.merge_synonyms = 0.7
  return c


def summarize(rows: Sequence[dict]) -> list[dict]:
  """Per (dataset, variant): mean accuracy and context recall, and the change against full."""
  groups: dict[tuple[str, str], list[dict]] = {}
  for r in rows:
    groups.setdefault((r["dataset"], r["variant"]), []).append(r)
  means = {k: {m: float(np.mean([r[m] for r in rs])) for m in ("accuracy", "context_recall",
                                                               "epsilon")}
           for k, rs in groups.items()}
  out = []
  for (dataset, variant), m in means.items():
    full = means.get((dataset, "full"))
    out.append({"dataset": dataset, "variant": variant, "seeds": len(groups[(dataset, variant)]),
                **m, "synthetic_texts": float(np.mean([r["synthetic_texts"]
                                                       for r in groups[(dataset, variant)]])),
                "accuracy_change": m["accuracy"] - full["accuracy"] if full else None,
                "context_recall_change": (m["context_recall"] - full["context_recall"]
                                          if full else None)})
  return sorted(out, key=lambda s: (s["dataset"], VARIANTS.index(s["variant"])))


def markdown(summary: Sequence[dict]) -> str:
  pct = lambda v: "-" if v is None else f"{100 * v:+.1f}"
  lines = ["### DP-SynRAG ablations (mean over seeds; change against full in points)", "",
           "| dataset | variant | accuracy % | change | context recall % | change | texts | "
           "epsilon spent |", "|---|---|---|---|---|---|---|---|"]
  for s in summary:
    lines.append(f"| {s['dataset']} | {s['variant']} | {100 * s['accuracy']:.1f} | "
                 f"{pct(s['accuracy_change'])} | {100 * s['context_recall']:.1f} | "
                 f"{pct(s['context_recall_change'])} | {s['synthetic_texts']:.0f} | "
                 f"{s['epsilon']:.2f} |")
  return "\n".join(lines) + "\n"


def run(config, workdir: str) -> list[dict]:
  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, "ablations.jsonl")
  rows = wd_lib.read_jsonl(path)
  done = {(r["dataset"], r["variant"], r["seed"]) for r in rows}
  lm, encoder = evaluate.load_models(config)
  for dataset in evaluate.split_list(config.datasets):
    task = evaluate.load_eval_task(config, dataset)
    for seed in [int(s) for s in evaluate.split_list(config.seeds)]:
      for variant in evaluate.split_list(config.variants):
        if (dataset, variant, seed) in done:
          continue
        logging.info("Ablation %s on %s, seed %d.", variant, dataset, seed)
        synrag = variant_config(evaluate.synrag_config(config, task, seed), variant)
        method = evaluate.make_method("dp_synrag", config, task, lm, encoder, seed, workdir,
                                      len(task.test), synrag=synrag,
                                      tag="" if variant == "full" else variant)
        result = evaluate.evaluate_method(method, task, task.test)
        row = {"dataset": dataset, "variant": variant, "seed": seed,
               "synthetic_texts": len(method.synthetic_texts),
               **{k: result[k] for k in ("accuracy", "context_recall", "epsilon",
                                         "seconds_build", "seconds_answer")}}
        wd_lib.append_jsonl(path, [row])
        rows.append(row)
        logging.info("%s", row)
  summary = summarize(rows)
  with open(os.path.join(workdir, "ablations.json"), "w", encoding="utf-8") as f:
    json.dump({"rows": rows, "summary": summary}, f, indent=1)
  with open(os.path.join(workdir, "ablations.md"), "w", encoding="utf-8") as f:
    f.write(markdown(summary))
  return summary


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  run(cli.FLAGS.config, cli.FLAGS.workdir)


if __name__ == "__main__":
  cli.define_config_and_workdir("Ablation config.")
  app.run(main)
