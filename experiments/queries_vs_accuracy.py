"""Accuracy and context recall against the number of questions, at fixed eps_total.

    python -m experiments.queries_vs_accuracy \
        --config=experiments/configs/queries_vs_accuracy.py:cpu --workdir=runs/eval

A user holds eps_total and plans n questions. DP-RAG must split eps_total over them, so each
point (eps_total, n) asks the first num_questions test questions in sessions of n, each session a
fresh DP-RAG with budget eps_total / n per question. DP-SynRAG builds once per eps_total and then
answers any number of questions for free, so its score is one evaluation drawn flat across n;
RAG (eps = inf) and Non-RAG (eps = 0) are flat references.

Writes WORKDIR/queries_vs_accuracy.jsonl (resumable), queries_vs_accuracy.json, .md and .png.
"""

from __future__ import annotations

import json
import os
import time
from typing import Sequence

from absl import logging
import numpy as np
import tqdm

from dpsynrag_jax import baselines
from dpsynrag_jax import evaluation
from dpsynrag_jax.evaluation import reporting
from dpsynrag_jax.rag import metrics
from dpsynrag_jax.synrag import workdir as wd_lib
from experiments import cli



def _numbers(text: str, kind=float) -> list:
  return [kind(v) for v in evaluation.split_list(text)]


def dp_rag_sessions(config, task, lm, encoder, embeddings: np.ndarray, questions,
                    eps_total: float, n: int, seed: int,
                    log_path: str | None = None) -> baselines.Answers:
  """Answers `questions` in consecutive sessions of n, each a DP-RAG holding eps_total.

  log_path: a private answer log (evaluation.read_answer_log's format) appended after every
  session, so a point cut off resumes at its first unlogged session. Each session has its own
  key stream (session index), so the resumed answers are those of an uninterrupted run."""
  texts = [q.text for q in questions]
  done = evaluation.read_answer_log(log_path, texts) if log_path else []
  if len(done) < len(texts):   # whole sessions only (each is logged at once; the last may be short)
    done = done[:len(done) - len(done) % n]
  r = config.dp_rag
  starts = range(len(done), len(texts), n)
  for start in tqdm.tqdm(starts, desc=f"DP-RAG sessions of {n}", unit="session",
                         disable=len(starts) < 2):
    method = baselines.DPRAG(lm, encoder, task, epsilon_total=eps_total, num_queries=n,
                             delta=config.delta, k=r.k, T=r.T, omega=r.omega,
                             retrieval_share=r.retrieval_share, seed=seed,
                             session=start // n,   # a key stream of its own per session
                             embeddings=embeddings, noise=evaluation.NOISE)
    method.build()
    began = time.time()
    session = texts[start:start + n]
    out = method.answer(session)
    done += (evaluation.log_answers(log_path, session, out, time.time() - began) if log_path
             else [{"answer": a, "context": list(c)} for a, c in zip(out.answers, out.contexts)])
  return evaluation.answers_of(done)


def _evaluated_row(evaluated: dict, name: str, config, task, seed: int, questions,
                   synrag) -> dict | None:
  """Scores of the first len(questions) test questions from the experiments.evaluate row
  (results.jsonl, keyed by settings) of the same method settings, or None.

  A flat method's point asks each question once, as evaluate does, so evaluate's answers to
  these questions are the point's answers: its per-question scores of the first m questions
  give the point (a MovieLens flat point costs a DP-SynRAG build and two readers' passes
  otherwise)."""
  m = len(questions)
  key = evaluation.settings_digest(
      evaluation.method_settings(name, config, task, seed, len(task.test), synrag=synrag))
  row = evaluated.get(key)
  if row is None or m > len(task.test):
    return None
  per = row["per_question"]
  recalled = per["recalled"]
  return {"accuracy": float(np.mean(per["correct"][:m])),
          "context_recall": None if recalled is None else float(np.mean(recalled[:m])),
          "evaluated_as": key}


def _score(task, questions, out: baselines.Answers, retrieves: bool) -> dict:
  golds = [q.answers for q in questions]
  return {"accuracy": metrics.accuracy(out.answers, golds, task.matches),
          "context_recall": (metrics.context_recall(out.contexts, golds, task.matches)
                             if retrieves else None)}


def points(config, workdir: str) -> list[dict]:
  """Every (method, eps_total, n, seed) point; resumable through the jsonl file."""
  path = os.path.join(workdir, "queries_vs_accuracy.jsonl")
  history = {r["settings"]: r for r in wd_lib.read_jsonl(path) if "settings" in r}
  evaluated = {r["settings"]: r for r in wd_lib.read_jsonl(os.path.join(workdir, "results.jsonl"))
               if "settings" in r}
  rows = []   # this config's rows
  counts = _numbers(config.query_counts, int)
  if not counts or min(counts) < 1:
    raise ValueError(f"query_counts must be positive integers, got {config.query_counts!r}.")
  lm, encoder = evaluation.load_models(config)
  dataset = evaluation.split_list(config.datasets)[0]
  task = evaluation.load_eval_task(config, dataset)
  evaluation.check_eval_data(workdir, config, dataset, task)
  questions = task.test[:config.num_questions]
  embeddings = None

  def settings(name, eps, n, seed, synrag=None):
    shared = evaluation.method_settings(name, config, task, seed, len(questions), synrag=synrag)
    return evaluation.settings_digest({**shared, "epsilon_total": eps, "queries": n,
                                     "questions": len(questions)})

  def cached(key):
    if key in history:
      rows.append(history[key])
      return True
    return False

  def add(key, method, eps, n, seed, scores, seconds, noise=None):
    row = {"dataset": dataset, "method": method, "epsilon_total": eps, "queries": n,
           "seed": seed, "questions": len(questions), "seconds": round(seconds, 1),
           "settings": key, **scores}
    if noise:
      row["noise"] = noise
    wd_lib.append_jsonl(path, [row])
    rows.append(row)
    history[key] = row
    logging.info("%s", row)

  for seed in _numbers(config.seeds, int):
    flat = [("Non-RAG", "non_rag", None), ("RAG", "rag", None)]
    flat += [("DP-SynRAG", "dp_synrag", eps) for eps in _numbers(config.epsilons)]
    for label, name, eps in flat:
      synrag = None
      if name == "dp_synrag":
        synrag = evaluation.synrag_config(config, task, seed)
        synrag.privacy.epsilon = eps
      key = settings(name, eps, None, seed, synrag)
      if cached(key):
        continue
      noise = synrag.privacy.noise if synrag is not None else None
      same = _evaluated_row(evaluated, name, config, task, seed, questions, synrag)
      if same is not None:   # experiments.evaluate scored these very answers already
        add(key, label, eps, None, seed, same, 0.0, noise)
        continue
      start = time.time()
      method = evaluation.make_method(name, config, task, lm, encoder, seed, workdir,
                                    len(questions), synrag=synrag)
      method.build()
      out = method.answer([q.text for q in questions])
      add(key, label, eps, None, seed, _score(task, questions, out, method.retrieves),
          time.time() - start, noise)
    for eps in _numbers(config.epsilons):
      for n in counts:
        key = settings("dp_rag", eps, n, seed)
        if cached(key):
          continue
        if embeddings is None:
          embeddings = encoder.embed(list(task.documents))  # private, in memory only
        # The log quotes retrieved private documents: it lives under private/.
        log = os.path.join(workdir, "private", f"dp_rag_sessions_{key}.jsonl")
        out = dp_rag_sessions(config, task, lm, encoder, embeddings, questions, eps, n, seed,
                              log_path=log)
        # Answering seconds of every run that logged a session (a resumed point's total).
        seconds = sum(r.get("seconds", 0.0) for r in wd_lib.read_jsonl(log))
        add(key, "DP-RAG", eps, n, seed, _score(task, questions, out, True), seconds,
            evaluation.NOISE)
  return rows


def summarize(rows: Sequence[dict], counts: Sequence[int]) -> list[dict]:
  """Mean over seeds per (method, eps_total, n); flat methods are repeated at every n."""
  groups: dict[tuple, list[dict]] = {}
  for r in rows:
    for n in ([r["queries"]] if r["queries"] is not None else counts):
      groups.setdefault((r["method"], r["epsilon_total"], n), []).append(r)
  out = []
  for (method, eps, n), rs in groups.items():
    recall = [r["context_recall"] for r in rs if r["context_recall"] is not None]
    out.append({"method": method, "epsilon_total": eps, "queries": n, "seeds": len(rs),
                "accuracy": float(np.mean([r["accuracy"] for r in rs])),
                "context_recall": float(np.mean(recall)) if recall else None})
  return sorted(out, key=lambda s: (reporting.method_rank(s["method"]),
                                    -1 if s["epsilon_total"] is None else s["epsilon_total"],
                                    s["queries"]))


def markdown(summary: Sequence[dict], counts: Sequence[int]) -> str:
  lines = ["### Accuracy % / context recall % against questions asked (eps_total fixed)", "",
           "| method | eps_total | " + " | ".join(f"n={n}" for n in counts) + " |",
           "|---|---|" + "---|" * len(counts)]
  fmt = lambda v: "-" if v is None else f"{100 * v:.0f}"
  keys = []
  for s in summary:
    if (s["method"], s["epsilon_total"]) not in keys:
      keys.append((s["method"], s["epsilon_total"]))
  for method, eps in keys:
    cells = {s["queries"]: s for s in summary if (s["method"], s["epsilon_total"]) == (method, eps)}
    eps_text = {"Non-RAG": "0", "RAG": "∞"}.get(method) or f"{eps:g}"
    lines.append(f"| {method} | {eps_text} | " + " | ".join(
        f"{fmt(cells[n]['accuracy'])} / {fmt(cells[n]['context_recall'])}" if n in cells else "-"
        for n in counts) + " |")
  return "\n".join(lines) + "\n"


def plot(summary: Sequence[dict], counts: Sequence[int], epsilons: Sequence[float],
         path: str) -> None:
  """One column per eps_total; accuracy on top, context recall below."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, axes = plt.subplots(2, len(epsilons), figsize=(3.2 * len(epsilons), 5.6), sharey="row",
                           squeeze=False)
  styles = {"DP-SynRAG": "o-", "DP-RAG": "s-", "RAG": "k--", "Non-RAG": "k:"}
  for col, eps in enumerate(epsilons):
    for row, metric in enumerate(("accuracy", "context_recall")):
      ax = axes[row][col]
      for method, style in styles.items():
        pts = [s for s in summary if s["method"] == method and
               (s["epsilon_total"] in (None, eps)) and s[metric] is not None]
        if pts:
          pts.sort(key=lambda s: s["queries"])
          ax.plot([s["queries"] for s in pts], [100 * s[metric] for s in pts], style,
                  label=method)
      ax.set_xticks(list(counts))
      if row == 0:
        ax.set_title(f"eps_total = {eps:g}")
      else:
        ax.set_xlabel("questions asked")
      if col == 0:
        ax.set_ylabel(metric.replace("_", " ") + " (%)")
  axes[0][0].legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def run(config, workdir: str) -> list[dict]:
  os.makedirs(workdir, exist_ok=True)
  rows = points(config, workdir)
  counts = _numbers(config.query_counts, int)
  summary = summarize(rows, counts)
  with open(os.path.join(workdir, "queries_vs_accuracy.json"), "w", encoding="utf-8") as f:
    results = {"rows": rows, "summary": summary}
    if evaluation.benchmark_note(rows):
      results["note"] = evaluation.benchmark_note(rows)
    json.dump(results, f, indent=1)
  with open(os.path.join(workdir, "queries_vs_accuracy.md"), "w", encoding="utf-8") as f:
    f.write(markdown(summary, counts))
  plot(summary, counts, _numbers(config.epsilons), os.path.join(workdir,
                                                                 "queries_vs_accuracy.png"))
  return summary


def sweep_rows(config, workdir: str) -> list[dict]:
  """A finished run's rows for launch.sweep's tables."""
  del config
  return wd_lib.read_jsonl(os.path.join(workdir, "queries_vs_accuracy.jsonl"))


if __name__ == "__main__":
  cli.run_app(run, "Config.")
