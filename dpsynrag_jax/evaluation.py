"""The evaluation harness: methods built from an evaluation config, scored on a task.

An evaluation config (experiments/configs/evaluate.py) names methods, datasets and seeds; this
module turns one (method, task, seed) into a `baselines.Method` (`make_method`), the
DP-SynRAG pipeline config the evaluation derives for it (`synrag_config`) and the work dir of
that build (`synrag_build_dir`: one per config digest, shared by every app in a work dir),
the settings that decide a result row (`method_settings`, keyed by `settings_digest`), and the
row itself (`evaluate_method`: accuracy, context recall, leakage, epsilon). The experiment apps
(experiments/) parse flags, loop and write tables.

What an evaluation releases is public settings only. The DP-SynRAG build config carries the
evaluation config's own num_documents (a cap, 0 = all) and no local path: the harness hands the
build its documents (baselines.DPSynRAG(documents=...)). Result rows are keyed by the digest of
public settings (`method_settings`: no measured corpus size, no path). What was measured (the
documents' count and digest, the folder read) stays on the work dir's private side
(`check_eval_data`), which refuses to key rows of other documents under the same settings.

Every noisy method runs in seeded noise mode (NOISE): the rows are reproducible benchmarks, not
private releases (anyone who knows a row's seed can redraw its noise); rows say so ("noise")
and results.json carries BENCHMARK_NOTE.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Sequence

import ml_collections
from ml_collections import config_dict

from dpsynrag_jax import baselines
from dpsynrag_jax import digests
from dpsynrag_jax.data.tasks import DATA_OF_TASK, Task, load_task
from dpsynrag_jax.models import dtype_named, load_encoder, load_lm
from dpsynrag_jax.rag import answer as rag_answer
from dpsynrag_jax.rag import metrics
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


# Questions answered between two appends to the answer log: two full reader batches (the
# language model pads a batch to a multiple of 8 rows; 10 questions ran 16 rows, 6 of them
# padding, which on MovieLens' 2048-token RAG prompts was 37 % of the prefill).
ANSWER_CHUNK = 16


def _question_digest(text: str) -> str:
  return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _answers_to(records: Sequence[dict], questions: Sequence[str]) -> bool:
  """Whether logged `records` answer the first len(records) of `questions`, in order."""
  return len(records) <= len(questions) and all(
      r["question"] == _question_digest(q) for r, q in zip(records, questions))


def answer_resumably(method: baselines.Method, questions: Sequence[str],
                     log_path: str | None) -> tuple[baselines.Answers, float]:
  """method.answer over `questions`, appending every ANSWER_CHUNK answers to the JSONL
  `log_path`, so that a run cut off resumes after the last chunk logged; (answers, seconds
  spent answering over every run). With log_path None, one call and nothing written.

  Answers read back are not asked again; `method.skip` accounts for them (DP-RAG charges
  their budget and uses up their keys), so a resumed run gives what an uninterrupted one
  gives. The log holds the texts each answer saw (private documents for RAG and DP-RAG): it
  belongs under a work dir's private/ side.
  """
  if log_path is None:
    start = time.time()
    return method.answer(list(questions)), time.time() - start
  done = read_answer_log(log_path, questions)
  method.skip(len(done))
  for begin in range(len(done), len(questions), ANSWER_CHUNK):
    chunk = list(questions[begin:begin + ANSWER_CHUNK])
    start = time.time()
    out = method.answer(chunk)
    done.extend(log_answers(log_path, chunk, out, time.time() - start))
  return answers_of(done), sum(r["seconds"] for r in done)


def read_answer_log(log_path: str, questions: Sequence[str]) -> list[dict]:
  """The records of an answer log (answer_resumably's format), checked to answer the first of
  `questions` in order; the file is rewritten as read, so a torn last line is not followed by
  new records. A missing log reads as no records."""
  done = wd_lib.read_jsonl(log_path)
  if not _answers_to(done, questions):
    raise ValueError(f"{log_path} logs answers to other questions than these; delete it to "
                     "answer again.")
  os.makedirs(os.path.dirname(log_path), exist_ok=True)
  wd_lib.atomic_write_text(log_path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in done))
  return done


def log_answers(log_path: str, questions: Sequence[str], out: baselines.Answers,
                seconds: float) -> list[dict]:
  """Appends the answers `out` to `questions` (taking `seconds` in all) to the log; returns
  the records written."""
  each = seconds / max(len(questions), 1)
  records = [{"question": _question_digest(q), "answer": a, "context": list(c),
              "seconds": round(each, 3)} for q, a, c in zip(questions, out.answers, out.contexts)]
  wd_lib.append_jsonl(log_path, records)
  return records


def answers_of(records: Sequence[dict]) -> baselines.Answers:
  return baselines.Answers([r["answer"] for r in records], [r["context"] for r in records])


def evaluate_method(method: baselines.Method, task: Task, queries,
                    attacks: Sequence[str] = (), log_dir: str | None = None) -> dict:
  """Builds, answers and scores one method; the row of the results table (with "noise", the
  method's noise mode, for a method that draws noise).

  `attacks` are extraction questions asked after the benign ones; only their leakage counts.
  With `log_dir` (private: it holds what each answer saw), answers are logged as they come
  (answer_resumably) and a rerun after a crash continues from the last logged chunk.
  """
  start = time.time()
  if log_dir:
    method.checkpoint_dir = log_dir
  method.build()
  built = time.time()
  log = (lambda part: os.path.join(log_dir, f"{part}.jsonl")) if log_dir else (lambda part: None)
  out, seconds_answer = answer_resumably(method, [q.text for q in queries], log("benign"))
  attack_answers = []
  if attacks:
    # Extraction questions go through the generic reader prompt: a task prompt that asks for a
    # disease would hide what the texts let a reader print (a defence by prompt, not privacy).
    reader = getattr(method, "reader", None)
    if reader is not None:
      method.reader = rag_answer.reader_prompt("paper")
    attack_out, attack_seconds = answer_resumably(method, list(attacks), log("attacks"))
    attack_answers = attack_out.answers
    seconds_answer += attack_seconds
    if reader is not None:
      method.reader = reader
  noise = {"noise": method.noise} if method.noise else {}
  return {
      **score_answers(task, queries, out, method.retrieves, attacks, attack_answers),
      **noise,
      "epsilon": method.epsilon,
      "questions": len(queries),
      "seconds_build": round(built - start, 1),
      "seconds_answer": round(seconds_answer, 1),
  }


# Version of the tasks' answer matchers. A results row scored under an older one is scored
# again from its answer log (rescore_row), never answered again. 2: SearchQA answers must
# appear as whole words (a gold "C" had matched every answer holding the letter c).
SCORING = 2


def score_answers(task: Task, queries, out: baselines.Answers, retrieves: bool,
                  attacks: Sequence[str] = (), attack_answers: Sequence[str] = ()) -> dict:
  """The scored part of a results row: accuracy, context recall, leakage, examples."""
  golds = [q.answers for q in queries]
  per_question = {  # for analyses by question (rare topics); gold answers are public test data
      "gold": [list(g) for g in golds],
      "correct": [int(task.matches(a, g)) for a, g in zip(out.answers, golds)],
      "recalled": ([int(any(task.matches(c, g) for c in ctx))
                    for ctx, g in zip(out.contexts, golds)] if retrieves else None),
  }
  return {
      "accuracy": metrics.accuracy(out.answers, golds, task.matches),
      "context_recall": (metrics.context_recall(out.contexts, golds, task.matches)
                         if retrieves else None),
      "leakage": metrics.leakage(out.answers, task.private_names),
      "attacks": len(attacks),
      "attack_leakage": metrics.leakage(list(attack_answers), task.private_names),
      "examples": [{"question": q.text, "gold": list(q.answers), "answer": a}
                   for q, a in list(zip(queries, out.answers))[:3]],
      "attack_examples": [{"question": q, "answer": a}
                          for q, a in list(zip(attacks, attack_answers))[:3]],
      "per_question": per_question,
      "scoring": SCORING,
  }


def _logged(log_path: str, questions: Sequence[str]) -> baselines.Answers | None:
  """The answers a log holds to exactly `questions`, or None if it holds other or fewer."""
  done = wd_lib.read_jsonl(log_path)
  if len(done) != len(questions) or not _answers_to(done, questions):
    return None
  return baselines.Answers([r["answer"] for r in done], [r["context"] for r in done])


def rescore_row(row: dict, task: Task, queries, attacks: Sequence[str],
                log_dir: str) -> dict | None:
  """`row` scored again under SCORING from its answer logs (nothing is asked again), or None
  where the logs do not hold every answer the row was scored on."""
  out = _logged(os.path.join(log_dir, "benign.jsonl"), [q.text for q in queries])
  if out is None:
    return None
  attack_answers = []
  if attacks:
    attack_out = _logged(os.path.join(log_dir, "attacks.jsonl"), list(attacks))
    if attack_out is None:
      return None
    attack_answers = attack_out.answers
  retrieves = row.get("context_recall") is not None
  return {**row, **score_answers(task, queries, out, retrieves, attacks, attack_answers)}


def load_models(config):
  """(lm, encoder) of an evaluation config."""
  return (load_lm(config.model.lm, dtype=dtype_named(config.model.dtype)),
          load_encoder(config.model.encoder))


def load_eval_task(config, dataset: str) -> Task:
  """The evaluation's task: its first num_documents documents and num_test test questions
  (0: all).

  A MovieLens config made for one layout (config.movielens_layout) refuses a folder of the
  other: its settings (documents, R, batches) are the constants of one public dataset.
  """
  path = config.paths.get(dataset, "")
  expected = config.get("movielens_layout", "")
  if dataset == "movielens" and expected and path:
    from dpsynrag_jax.data.movielens_files import detect_layout  # pylint: disable=g-import-not-at-top
    found = detect_layout(path)
    if found != expected:
      arg = {"ml-100k": "movielens_cpu", "ml-1m": "movielens_paper"}[found]
      raise ValueError(f"{path} holds MovieLens {found}, but this config's settings are for "
                       f"{expected}; use --config=experiments/configs/evaluate.py:{arg} (the "
                       f"settings for {found}).")
  # 0 documents or test questions means all of them.
  return load_task(dataset, path=path, num_documents=config.num_documents or None,
                   num_validation=0, num_test=config.num_test or None, seed=0)


def benchmark_note(rows: Sequence[dict]) -> str | None:
  """BENCHMARK_NOTE when some row drew seeded noise, else None (for the results files)."""
  return BENCHMARK_NOTE if any(r.get("noise") == "seeded" for r in rows) else None


def check_eval_data(workdir: str, config, dataset: str, task: Task) -> None:
  """Records on the work dir's private side what the evaluation read for `dataset` under its
  public settings (dataset, num_documents cap): the documents' count and digest and the local
  path. Rows and builds are keyed by public settings only, so a later run with the same
  settings over other documents (another copy of the dataset) is refused here instead of
  reusing rows and builds of the first. The record is an evaluation artifact and private (the
  corpus size): never published.

  Raises ValueError when the record names other documents.
  """
  folder = os.path.join(workdir, wd_lib.PRIVATE, "data")
  path = os.path.join(folder, f"{dataset}_num_documents{int(config.num_documents)}.json")
  record = {"dataset": dataset, "num_documents": int(config.num_documents),
            "documents": len(task.documents),
            "documents_sha256": digests.sequence_sha256(task.documents),
            "path": config.paths.get(dataset, "")}
  if os.path.exists(path):
    recorded = wd_lib.read_json(path)
    if recorded["documents_sha256"] != record["documents_sha256"]:
      raise ValueError(
          f"{workdir} holds rows and builds of other {dataset} documents under the same "
          f"settings (num_documents={record['num_documents']}; they were read from "
          f"{recorded['path'] or 'the vendored data'}): use a new work dir for these.")
    return
  os.makedirs(folder, mode=0o700, exist_ok=True)
  wd_lib.atomic_write_json(path, record)
