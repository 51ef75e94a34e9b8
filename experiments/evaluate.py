"""Methods x datasets x seeds: accuracy, context recall, leakage and epsilon (Table 1).

    python -m experiments.evaluate --config=experiments/configs/evaluate.py:cpu --workdir=runs/eval

Writes WORKDIR/results.jsonl (one row per dataset, method, seed and method settings, appended as
each finishes, so a rerun skips finished rows), results.json, table.md and accuracy.png. A row is
keyed by a digest of everything that decides its result (`method_settings`): a rerun with other
settings in the same work dir computes new rows, and the tables show the current settings'
rows only. DP-SynRAG builds go to WORKDIR/dp_synrag/<dataset>_seed<s>_<config digest>/ and are
shared by every app run in the same work dir with an equal pipeline config.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Sequence

from absl import logging
import jax.numpy as jnp

from dpsynrag_jax import baselines
from dpsynrag_jax import privacy
from dpsynrag_jax.data.tasks import Task, load_task
from dpsynrag_jax.models import load_encoder, load_lm
from dpsynrag_jax.rag import answer as rag_answer
from dpsynrag_jax.rag import metrics
from dpsynrag_jax.synrag import workdir as wd_lib
from experiments import cli
from experiments import reporting
from experiments.configs import evaluate as evaluate_config


METHOD_NAMES = {"non_rag": "Non-RAG", "rag": "RAG", "dp_synrag": "DP-SynRAG",
                "dp_synth": "DP-Synth", "dp_rag": "DP-RAG", "aug_pe": "Aug-PE"}
_PIPELINE_DATA = {"medical": "medical_synth", "movielens": "movielens", "searchqa": "searchqa"}


def split_list(text: str) -> list[str]:
  return [t.strip() for t in str(text).split(",") if t.strip()]


def synrag_config(config, task: Task, seed: int):
  """The pipeline config of one DP-SynRAG run: the eval's data, models, seed and budget.

  Raises ValueError if one of those was set under dp_synrag (it would be ignored).
  """
  c = config.dp_synrag.copy_and_resolve_references()
  c.unlock()
  for dotted, source in evaluate_config.OWNED_BY_EVALUATION.items():
    value = c
    for part in dotted.split("."):
      value = value[part]
    if value is not None:
      raise ValueError(f"--config.dp_synrag.{dotted} is set by the evaluation from "
                       f"{source}; set that instead.")
  c.seed = seed
  c.data.name = _PIPELINE_DATA[task.name]
  c.data.path = config.paths.get(task.name, "") if task.name != "medical" else ""
  c.data.num_documents = len(task.documents)
  c.data.split_seed = 0
  c.model = config.model.copy_and_resolve_references()
  c.privacy.epsilon = config.epsilon
  c.privacy.delta = config.delta
  c.self_filter.prompt = task.self_filter_prompt or "medical"
  c.self_filter.enabled = bool(config.self_filter and task.self_filter_prompt)
  return c


def synrag_build_dir(workdir: str, synrag) -> str:
  """Where the DP-SynRAG build of pipeline config `synrag` goes: one directory per config
  digest, so apps sharing a work dir share builds of equal config and never overwrite one."""
  name = f"{synrag.data.name}_seed{synrag.seed}_{wd_lib.config_digest(synrag.to_dict())}"
  return os.path.join(workdir, "dp_synrag", name)


def settings_digest(settings: dict) -> str:
  text = json.dumps(settings, sort_keys=True, default=str)
  return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def method_settings(name: str, config, task: Task, seed: int, num_queries: int,
                    synrag=None) -> dict:
  """Everything that decides a method's row: the key of results.jsonl (as settings_digest)."""
  shared = {"method": name, "dataset": task.name, "seed": seed,
            "documents": len(task.documents), "test": len(task.test),
            "attacks": config.get("num_attacks", 0), "answer_tokens": config.answer_tokens,
            "model": config.model.to_dict(), "path": config.paths.get(task.name, ""),
            "reader": config.get("reader_prompt", "paper"), "attack_reader": "paper"}
  if name == "dp_synrag":
    build = synrag or synrag_config(config, task, seed)
    return {**shared, "build": wd_lib.config_digest(build.to_dict()), "top_k": task.top_k}
  if name == "dp_synth":
    return {**shared, "epsilon": config.epsilon, "delta": config.delta,
            "self_filter": bool(config.self_filter), **config.dp_synth.to_dict()}
  if name == "dp_rag":
    return {**shared, "delta": config.delta, "budget": dp_rag_budget(config, num_queries),
            "queries": num_queries, **config.dp_rag.to_dict()}
  if name == "aug_pe":
    return {**shared, "epsilon": config.epsilon, "delta": config.delta,
            **config.aug_pe.to_dict()}
  return shared


def dp_rag_budget(config, num_queries: int) -> float:
  """DP-RAG's eps_total: per-query epsilon x questions (the paper's Table 1) or config.epsilon."""
  per_query = config.dp_rag.get("epsilon_per_query", 0.0)
  return per_query * num_queries if per_query > 0 else config.epsilon


def make_method(name: str, config, task: Task, lm, encoder, seed: int, workdir: str,
                num_queries: int, synrag=None) -> baselines.Method:
  """The method `name` as configured; `synrag` overrides the DP-SynRAG pipeline config
  (ablations, other budgets)."""
  method = _make_method(name, config, task, lm, encoder, seed, workdir, num_queries, synrag)
  if isinstance(method, baselines.RetrievalMethod):
    method.reader = rag_answer.reader_prompt(config.get("reader_prompt", "paper"), task.name)
  return method


def _make_method(name, config, task, lm, encoder, seed, workdir, num_queries, synrag):
  tokens = config.answer_tokens
  if name == "non_rag":
    return baselines.NonRAG(lm, max_new_tokens=tokens)
  if name == "rag":
    return baselines.RAG(lm, encoder, task, max_new_tokens=tokens)
  if name == "dp_synrag":
    synrag = synrag or synrag_config(config, task, seed)
    return baselines.DPSynRAG(lm, encoder, synrag, synrag_build_dir(workdir, synrag),
                              top_k=task.top_k, max_new_tokens=tokens)
  if name == "dp_synth":
    return baselines.DPSynth(lm, encoder, task, epsilon=config.epsilon, delta=config.delta,
                             T=config.dp_synth.T, num_batches=config.dp_synth.num_batches,
                             seed=seed, max_new_tokens=tokens,
                             self_filter_enabled=bool(config.self_filter and
                                                      task.self_filter_prompt))
  if name == "dp_rag":
    r = config.dp_rag
    return baselines.DPRAG(lm, encoder, task, epsilon_total=dp_rag_budget(config, num_queries),
                           num_queries=num_queries, delta=config.delta, k=r.k, T=r.T,
                           omega=r.omega, retrieval_share=r.retrieval_share, seed=seed)
  if name == "aug_pe":
    return baselines.AugPE(lm, encoder, task, epsilon=config.epsilon, delta=config.delta,
                           population=config.aug_pe.population,
                           iterations=config.aug_pe.iterations, seed=seed,
                           answer_tokens=tokens)
  raise ValueError(f"Unknown method {name!r}; expected one of {sorted(METHOD_NAMES)}.")


def evaluate_method(method: baselines.Method, task: Task, queries,
                    attacks: Sequence[str] = ()) -> dict:
  """Builds, answers and scores one method; the row of the results table.

  `attacks` are extraction questions asked after the benign ones; only their leakage counts.
  """
  start = time.time()
  method.build()
  built = time.time()
  out = method.answer([q.text for q in queries])
  attack_answers = []
  if attacks:
    # Extraction questions go through the generic reader prompt: a task prompt that asks for a
    # disease would hide what the texts let a reader print (a defence by prompt, not privacy).
    reader = getattr(method, "reader", None)
    if reader is not None:
      method.reader = rag_answer.reader_prompt("paper")
    attack_answers = method.answer(list(attacks)).answers
    if reader is not None:
      method.reader = reader
  golds = [q.answers for q in queries]
  per_question = {  # for analyses by question (rare topics); gold answers are public test data
      "gold": [list(g) for g in golds],
      "correct": [int(task.matches(a, g)) for a, g in zip(out.answers, golds)],
      "recalled": ([int(any(task.matches(c, g) for c in ctx))
                    for ctx, g in zip(out.contexts, golds)] if method.retrieves else None),
  }
  return {
      "accuracy": metrics.accuracy(out.answers, golds, task.matches),
      "context_recall": (metrics.context_recall(out.contexts, golds, task.matches)
                         if method.retrieves else None),
      "leakage": metrics.leakage(out.answers, task.private_names),
      "attacks": len(attacks),
      "attack_leakage": metrics.leakage(attack_answers, task.private_names),
      "epsilon": method.epsilon,
      "questions": len(queries),
      "seconds_build": round(built - start, 1),
      "seconds_answer": round(time.time() - built, 1),
      "examples": [{"question": q.text, "gold": list(q.answers), "answer": a}
                   for q, a in list(zip(queries, out.answers))[:3]],
      "attack_examples": [{"question": q, "answer": a}
                          for q, a in list(zip(attacks, attack_answers))[:3]],
      "per_question": per_question,
  }


def load_models(config):
  """(lm, encoder) of an evaluation config."""
  dtype = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[config.model.dtype]
  return load_lm(config.model.lm, dtype=dtype), load_encoder(config.model.encoder)


def load_eval_task(config, dataset: str) -> Task:
  return load_task(dataset, path=config.paths.get(dataset, ""),
                   num_documents=config.num_documents, num_validation=0,
                   num_test=config.num_test, seed=0)


def run(config, workdir: str, tables: bool = True) -> list[dict]:
  """Every (dataset, seed, method) row of `config`, computed or read back; with `tables`, also
  results.json, table.md and accuracy.png of exactly these rows."""
  os.makedirs(workdir, exist_ok=True)
  results_path = os.path.join(workdir, "results.jsonl")
  history = wd_lib.read_jsonl(results_path)
  by_key = {r["settings"]: r for r in history if "settings" in r}
  rows = []   # this config's rows, in the order they are listed
  lm, encoder = load_models(config)
  for dataset in split_list(config.datasets):
    task = load_eval_task(config, dataset)
    attacks = task.attack_queries[:config.get("num_attacks", 0)]
    num_queries = len(task.test) + len(attacks)
    for seed in [int(s) for s in split_list(config.seeds)]:
      for name in split_list(config.methods):
        if name not in METHOD_NAMES:
          raise ValueError(f"Unknown method {name!r}; expected one of {sorted(METHOD_NAMES)}.")
        key = settings_digest(method_settings(name, config, task, seed, num_queries))
        if key in by_key:
          rows.append(by_key[key])
          continue
        logging.info("Evaluating %s on %s, seed %d.", METHOD_NAMES[name], dataset, seed)
        method = make_method(name, config, task, lm, encoder, seed, workdir, num_queries)
        row = {"dataset": dataset, "method": METHOD_NAMES[name], "seed": seed,
               "settings": key, **evaluate_method(method, task, task.test, attacks)}
        if name == "dp_synrag":
          row["build"] = os.path.relpath(method.workdir, workdir)
        wd_lib.append_jsonl(results_path, [row])
        rows.append(row)
        by_key[key] = row
        logging.info("%s", {k: v for k, v in row.items()
                            if "examples" not in k and k != "per_question"})
  if tables:
    reporting.write_tables(rows, workdir, title="Methods x datasets (mean +- std over seeds)")
  return rows


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
  cli.run_app(run, "Evaluation config.")
