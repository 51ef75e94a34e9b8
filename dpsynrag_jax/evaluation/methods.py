"""Methods built from an evaluation config, and the public settings that key their rows.

`make_method` turns one (method, task, seed) into a `baselines.Method`; `synrag_config` is the
DP-SynRAG pipeline config the evaluation derives for it and `synrag_build_dir` the work dir of
that build (one per config digest, shared by every app in a work dir); `method_settings`,
keyed by `settings_digest`, holds everything public that decides a result row. Every noisy
method runs in seeded noise mode (NOISE), and results files say so (BENCHMARK_NOTE).
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Sequence

import ml_collections
from ml_collections import config_dict

from dpsynrag_jax import baselines
from dpsynrag_jax.data.tasks import DATA_OF_TASK, Task
from dpsynrag_jax.rag import answer as rag_answer
from dpsynrag_jax.synrag import workdir as wd_lib


# Fields of the DP-SynRAG pipeline config that the evaluation fills in per run, and the
# evaluation field each comes from. They are placeholders (None) in `dp_synrag`: a user who
# sets one there gets an error naming the field to set instead, not a silently ignored flag.
OWNED_BY_EVALUATION = {
    "seed": "seeds",
    "data.name": "datasets",
    "data.path": "paths.<dataset>",
    "data.num_documents": "num_documents",
    "data.split_seed": "(the evaluation's split, seed 0)",
    "model.lm": "model.lm",
    "model.encoder": "model.encoder",
    "model.dtype": "model.dtype",
    "privacy.epsilon": "epsilon",
    "privacy.delta": "delta",
    "self_filter.enabled": "self_filter",
    "self_filter.prompt": "(the dataset's filter prompt)",
}


def leave_to_evaluation(pipeline_config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """pipeline_config with every OWNED_BY_EVALUATION field a typed placeholder (None)."""
  for dotted in OWNED_BY_EVALUATION:
    *parents, name = dotted.split(".")
    node = pipeline_config
    for parent in parents:
      node = node[parent]
    node[name] = config_dict.placeholder(type(node[name]))
  return pipeline_config


# The noise mode of every method the harness makes (privacy.keys.NOISE_MODES): a public seed per
# row, so results are reproducible (and not private releases).
NOISE = "seeded"
BENCHMARK_NOTE = ("Reproducible benchmarks, not private releases: every noisy method drew its "
                  "noise from its row's public seed (noise 'seeded'), so anyone who knows the "
                  "seed can redraw and subtract it. Release with noise 'secret'.")
# Methods that draw no noise.
NOISELESS = ("non_rag", "rag")

METHOD_NAMES = {"non_rag": "Non-RAG", "rag": "RAG", "dp_synrag": "DP-SynRAG",
                "dp_synth": "DP-Synth", "dp_rag": "DP-RAG", "aug_pe": "Aug-PE"}


def split_list(text: str) -> list[str]:
  return [t.strip() for t in str(text).split(",") if t.strip()]


def synrag_config(config, task: Task, seed: int):
  """The pipeline config of one DP-SynRAG run: the eval's data, models, seed and budget.

  It is released with the build (config.json) and names the build (config_digest), so it holds
  what the evaluation config names only: the dataset, the num_documents cap, no path.

  Raises ValueError if one of those was set under dp_synrag (it would be ignored).
  """
  c = config.dp_synrag.copy_and_resolve_references()
  c.unlock()
  for dotted, source in OWNED_BY_EVALUATION.items():
    value = c
    for part in dotted.split("."):
      value = value[part]
    if value is not None:
      raise ValueError(f"--config.dp_synrag.{dotted} is set by the evaluation from "
                       f"{source}; set that instead.")
  c.seed = seed
  c.data.name = DATA_OF_TASK[task.name]
  # Released with the build: no local path (make_method hands the build its documents) and the
  # evaluation's own cap, never the measured corpus size (private under add/remove-one).
  c.data.path = ""
  c.data.num_documents = int(config.num_documents)
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
  """Everything public that decides a method's row: the key of results.jsonl (as
  settings_digest). The documents enter as the config names them (dataset, num_documents cap),
  never as measured (their count) or where they were read (a local path): check_eval_data
  guards that one work dir keys only one set of documents under these settings."""
  shared = {"method": name, "dataset": task.name, "seed": seed,
            "num_documents": int(config.num_documents), "test": len(task.test),
            "attacks": config.num_attacks, "answer_tokens": config.answer_tokens,
            "model": config.model.to_dict(),
            "reader": config.reader_prompt, "attack_reader": "paper"}
  if name not in NOISELESS and name != "dp_synrag":   # DP-SynRAG's is in its build config
    shared["noise"] = NOISE
  if name == "dp_synrag":
    build = synrag or synrag_config(config, task, seed)
    return {**shared, "build": wd_lib.config_digest(build.to_dict()), "top_k": task.top_k}
  if name == "dp_synth":
    return {**shared, "epsilon": config.epsilon, "delta": config.delta,
            "self_filter": bool(config.self_filter), **config.dp_synth.to_dict()}
  if name == "dp_rag":
    return {**shared, "delta": config.delta, **dp_rag_budget(config, num_queries),
            "queries": num_queries, **config.dp_rag.to_dict()}
  if name == "aug_pe":
    return {**shared, "epsilon": config.epsilon, "delta": config.delta,
            **config.aug_pe.to_dict()}
  return shared


def dp_rag_budget(config, num_queries: int) -> dict:
  """DP-RAG's budget: epsilon per question, each calibrated alone (the paper's Table 1), or
  config.epsilon over all num_queries questions jointly (dp_rag.epsilon_per_query = 0)."""
  per_query = config.dp_rag.epsilon_per_query
  if per_query > 0:
    return {"per_question": per_query}
  return {"budget": config.epsilon}


def make_method(name: str, config, task: Task, lm, encoder, seed: int, workdir: str,
                num_queries: int, synrag=None) -> baselines.Method:
  """The method `name` as configured; `synrag` overrides the DP-SynRAG pipeline config
  (ablations, other budgets)."""
  method = _make_method(name, config, task, lm, encoder, seed, workdir, num_queries, synrag)
  if isinstance(method, baselines.RetrievalMethod):
    method.reader = rag_answer.reader_prompt(config.reader_prompt, task.name)
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
                              top_k=task.top_k, max_new_tokens=tokens,
                              documents=task.documents)
  if name == "dp_synth":
    return baselines.DPSynth(lm, encoder, task, epsilon=config.epsilon, delta=config.delta,
                             T=config.dp_synth.T, num_batches=config.dp_synth.num_batches,
                             seed=seed, noise=NOISE, max_new_tokens=tokens,
                             self_filter_enabled=bool(config.self_filter and
                                                      task.self_filter_prompt))
  if name == "dp_rag":
    r = config.dp_rag
    budget = dp_rag_budget(config, num_queries)
    budget = ({"epsilon_per_question": budget["per_question"]} if "per_question" in budget
              else {"epsilon_total": budget["budget"]})
    return baselines.DPRAG(lm, encoder, task, **budget,
                           num_queries=num_queries, delta=config.delta, k=r.k, T=r.T,
                           omega=r.omega, retrieval_share=r.retrieval_share, seed=seed,
                           noise=NOISE)
  if name == "aug_pe":
    return baselines.AugPE(lm, encoder, task, epsilon=config.epsilon, delta=config.delta,
                           population=config.aug_pe.population,
                           iterations=config.aug_pe.iterations, seed=seed, noise=NOISE,
                           answer_tokens=tokens)
  raise ValueError(f"Unknown method {name!r}; expected one of {sorted(METHOD_NAMES)}.")


def benchmark_note(rows: Sequence[dict]) -> str | None:
  """BENCHMARK_NOTE when some row drew seeded noise, else None (for the results files)."""
  return BENCHMARK_NOTE if any(r.get("noise") == "seeded" for r in rows) else None
