"""DP-SynRAG variants side by side with the full method, at one or several budgets.

    python -m experiments.ablations --config=experiments/configs/ablations.py:cpu --workdir=runs/eval
    python -m experiments.ablations --config=experiments/configs/utility_options.py:cpu \
        --workdir=runs/eval

The first removes one component at a time (the paper's ablations); the second adds one of this
project's utility options at a time, at eps 3 and 10. A variant may combine switches with '+'
(--config.variants=full,rdp+public_prior: one build with both). Writes WORKDIR/<report>.jsonl
(one row per dataset, variant, budget, seed and build config; a rerun skips finished rows) and
the reports WORKDIR/evaluation/<report>.json and <report>.md, with report = config.report.
Builds go where the evaluation's go (WORKDIR/dp_synrag/<dataset>_seed<s>_<config digest>), so
the full method at the evaluation's budget reuses the evaluation's build, and any variant at any
budget is built once.

With config.funnel (on by default), each row also carries its build's utility funnel
(experiments.funnel) and WORKDIR/evaluation/<report>_funnel.md puts the variants' funnels side
by side, so an ablation shows at which stage a variant gains or loses, not only by how much. A
finished row without a funnel (from a run before funnels) gets one on the next run: its build is
reused and its questions are answered again. Answers are logged under
WORKDIR/private/answers/<row key> (private: they hold what each answer saw), so a run cut off
mid-answers resumes.

The reports are evaluation artifacts (dpsynrag_jax.evaluation_artifacts): the funnels read each
build's private state and every figure is scored against the documents' answers, so they are
labelled, NOT differentially private, and written under WORKDIR/evaluation/, never beside
released files.
"""

from __future__ import annotations

import json
import os
from typing import Sequence

from absl import logging
import numpy as np

from dpsynrag_jax import evaluation
from dpsynrag_jax import evaluation_artifacts as artifacts
from dpsynrag_jax.evaluation import funnel as funnel_lib
from dpsynrag_jax.synrag import workdir as wd_lib
from experiments import cli

TOOL = "ablations"
READS = ("each variant build's private/ state and the documents' answers (the variants' "
         "funnels)")
VARIANTS = ("full", "no_rerank", "no_self_filter", "self_filter", "hard", "synonyms", "rdp",
            "public_prior", "difference", "candidates")


def variant_parts(variant: str) -> list[str]:
  """'rdp+public_prior' -> ['rdp', 'public_prior']: switches combined in one build."""
  parts = variant.split("+")
  for part in parts:
    if part not in VARIANTS:
      raise ValueError(f"Unknown variant {part!r}; expected one of {VARIANTS}, or several "
                       "joined with '+'.")
  return parts


def variant_config(base, variant: str):
  """The pipeline config of one variant: a copy of `base` with its switches changed."""
  c = base.copy_and_resolve_references()
  c.unlock()
  for part in variant_parts(variant):
    _switch(c, part)
  return c


def _switch(c, variant: str) -> None:
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
  elif variant == "rdp":
    c.privacy.accountant = "rdp"
  elif variant == "public_prior":
    c.generation.omega = 0.1
  elif variant == "difference":
    c.generation.clip = "difference"
  elif variant == "candidates":
    c.generation.candidates = 50
    c.generation.candidate_terms = c.data.name if c.data.name == "medical_synth" else ""


def budgets(config) -> list[float]:
  """config.epsilons (comma-separated), or config.epsilon when that is empty."""
  return [float(e) for e in evaluation.split_list(config.get("epsilons", "") or
                                                str(config.epsilon))]


def summarize(rows: Sequence[dict]) -> list[dict]:
  """Per (dataset, eps, variant): means over seeds and the change against full at that eps."""
  groups: dict[tuple, list[dict]] = {}
  for r in rows:
    groups.setdefault((r["dataset"], r["epsilon_total"], r["variant"]), []).append(r)
  metrics = ("accuracy", "context_recall", "epsilon", "synthetic_texts", "seconds_build")
  means = {k: {m: float(np.mean([r[m] for r in rs])) for m in metrics}
           for k, rs in groups.items()}
  out = []
  for (dataset, eps, variant), m in means.items():
    full = means.get((dataset, eps, "full"))
    out.append({"dataset": dataset, "epsilon_total": eps, "variant": variant,
                "seeds": len(groups[(dataset, eps, variant)]), **m,
                "accuracy_change": m["accuracy"] - full["accuracy"] if full else None,
                "context_recall_change": (m["context_recall"] - full["context_recall"]
                                          if full else None)})
  return sorted(out, key=lambda s: (s["dataset"], -s["epsilon_total"],
                                    [VARIANTS.index(p) for p in variant_parts(s["variant"])]))


def markdown(summary: Sequence[dict], title: str) -> str:
  pct = lambda v: "-" if v is None else f"{100 * v:+.1f}"
  lines = [f"### {title} (mean over seeds; change against full at the same eps, in points)", "",
           "| dataset | eps | variant | accuracy % | change | context recall % | change | texts | "
           "epsilon spent | build s |", "|---|---|---|---|---|---|---|---|---|---|"]
  for s in summary:
    lines.append(f"| {s['dataset']} | {s['epsilon_total']:g} | {s['variant']} | "
                 f"{100 * s['accuracy']:.1f} | {pct(s['accuracy_change'])} | "
                 f"{100 * s['context_recall']:.1f} | {pct(s['context_recall_change'])} | "
                 f"{s['synthetic_texts']:.0f} | {s['epsilon']:.2f} | {s['seconds_build']:.0f} |")
  return "\n".join(lines) + "\n"


def funnel_markdown(rows: Sequence[dict], title: str) -> str:
  """The rows' funnels side by side: one table per (dataset, eps, seed), a column per variant."""
  groups: dict[tuple, list[dict]] = {}
  for r in rows:
    if r.get("funnel"):
      groups.setdefault((r["dataset"], r["epsilon_total"], r["seed"]), []).append(r)
  fmt = funnel_lib.value_text
  parts = [f"### {title}: funnels by variant", ""]
  for (dataset, eps, seed), rs in sorted(groups.items(), key=lambda kv: (kv[0][0], -kv[0][1],
                                                                        kv[0][2])):
    parts += [f"{dataset}, eps {eps:g}, seed {seed}", "",
              "| stage | " + " | ".join(r["variant"] for r in rs) + " |",
              "|---|" + "---|" * len(rs)]
    stages = []   # every stage any variant has, in funnel order (rows of older runs lack some)
    for r in sorted(rs, key=lambda r: -len(r["funnel"])):
      stages += [s["stage"] for s in r["funnel"] if s["stage"] not in stages]
    for stage in stages:
      cells = []
      for r in rs:
        s = next((x for x in r["funnel"] if x["stage"] == stage), None)
        cells.append(f"{fmt(s['value'])} ({funnel_lib.cell(s['detail'])})"
                     if s and s["detail"] else fmt(s["value"]) if s else "-")
      parts.append(f"| {funnel_lib.cell(stage)} | " + " | ".join(cells) + " |")
    parts.append("")
  return "\n".join(parts)


def run(config, workdir: str) -> list[dict]:
  artifacts.announce(TOOL, READS)
  os.makedirs(workdir, exist_ok=True)
  report = config.get("report", "ablations")
  with_funnel = config.get("funnel", True)
  path = os.path.join(workdir, f"{report}.jsonl")
  history = {r["settings"]: r for r in wd_lib.read_jsonl(path) if "settings" in r}
  rows = []   # this config's rows
  lm, encoder = evaluation.load_models(config)
  for dataset in evaluation.split_list(config.datasets):
    task = evaluation.load_eval_task(config, dataset)
    evaluation.check_eval_data(workdir, config, dataset, task)
    for seed in [int(s) for s in evaluation.split_list(config.seeds)]:
      for eps in budgets(config):
        for variant in evaluation.split_list(config.variants):
          base = evaluation.synrag_config(config, task, seed)
          base.privacy.epsilon = eps
          synrag = variant_config(base, variant)
          key = evaluation.settings_digest({
              "variant": variant, **evaluation.method_settings(
                  "dp_synrag", config, task, seed, len(task.test), synrag=synrag)})
          done = history.get(key)
          if done is not None and (done.get("funnel") or not with_funnel):
            rows.append(done)
            continue
          logging.info("Variant %s at eps %g on %s, seed %d%s.", variant, eps, dataset, seed,
                       " (its funnel)" if done else "")
          method = evaluation.make_method("dp_synrag", config, task, lm, encoder, seed, workdir,
                                        len(task.test), synrag=synrag)
          log_dir = os.path.join(workdir, wd_lib.PRIVATE, "answers", key)
          result = evaluation.evaluate_method(method, task, task.test, log_dir=log_dir)
          # A row measured before funnels keeps its figures; only the funnel is new.
          row = dict(done) if done is not None else {
              "dataset": dataset, "variant": variant, "epsilon_total": eps, "seed": seed,
              "settings": key, "build": os.path.relpath(method.workdir, workdir),
              "synthetic_texts": len(method.synthetic_texts), "noise": method.noise,
              **{k: result[k] for k in ("accuracy", "context_recall", "epsilon",
                                        "seconds_build", "seconds_answer")}}
          if with_funnel:
            row["funnel"] = funnel_lib.build_funnel(
                method.workdir, task, encoder, lm.decode, result["per_question"],
                encode=lambda t: lm.encode([t])[0])["stages"]
          history[key] = row
          wd_lib.atomic_write_text(path, "".join(json.dumps(r, sort_keys=True) + "\n"
                                                 for r in history.values()))
          rows.append(row)
          logging.info("%s", {k: v for k, v in row.items() if k != "funnel"})
  summary = summarize(rows)
  title = config.get("title", "DP-SynRAG ablations")
  results = {"rows": rows, "summary": summary}
  if evaluation.benchmark_note(rows):
    results["note"] = evaluation.benchmark_note(rows)
  artifacts.write_json(artifacts.evaluation_path(workdir, f"{report}.json"), results, TOOL, READS)
  artifacts.write_text(artifacts.evaluation_path(workdir, f"{report}.md"),
                       markdown(summary, title), TOOL, READS)
  if with_funnel:
    artifacts.write_text(artifacts.evaluation_path(workdir, f"{report}_funnel.md"),
                         funnel_markdown(rows, title), TOOL, READS)
  return summary


def sweep_rows(config, workdir: str) -> list[dict]:
  """A finished run's rows for launch.sweep's tables."""
  return wd_lib.read_jsonl(os.path.join(workdir, f"{config.get('report', 'ablations')}.jsonl"))


if __name__ == "__main__":
  cli.run_app(run, "Ablation or utility-options config.")
