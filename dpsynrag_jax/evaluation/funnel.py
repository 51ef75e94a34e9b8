"""The utility funnel of a DP-SynRAG build, stage by stage: where the answers are lost.

Run by experiments.funnel (the commands are in its docstring).

For each dataset and seed of an evaluation config, the DP-SynRAG build (made or reused as the
evaluation makes it) and its evaluation rows, one table:

  clusters          non-empty clusters of R, mean |S_r| over them
  purity            share of S_r holding its majority answer: median, clusters >= 0.5, >= 0.8
  coverage          test questions whose answer is the majority answer of some cluster
  decode fidelity   clusters with purity >= 0.5 whose synthetic text contains their answer
  database recall   test questions whose answer appears in some released synthetic text
  context recall    ... in the top-k texts retrieved for the question
                    (and in at least two of them: the evidence a small reader needs)
  accuracy          answers containing the gold answer; and accuracy given context recall

With --plan and a build config (medical_synth.py), the build runs up to the re-ranking only
(runtime.stop_after_rerank: clusters chosen, nothing decoded) and the funnel's first three
stages are scored on VALIDATION questions, so settings can be chosen with it without touching
the test questions and without paying for a decode. The plan scores settings with the
documents' labels: tuning on them is not private (TUNING_WARNING), so plan on public data.

Each stage bounds the next (up to the majority being only one of a question's routes), so the
first stage that drops is where a change should aim. The funnel reads private ground truth and
private build state (cluster members, each cluster's tokens): it is an evaluation artifact
(dpsynrag_jax.evaluation_artifacts), not differentially private, written under evaluation/
folders only: the build's (DIR/evaluation/funnel.json, .md; a plan's DIR/evaluation/plan.json,
.md) and the evaluation work dir's (WORKDIR/evaluation/funnel_<dataset>_seed<seed>.json, .md),
never beside released files.
"""

from __future__ import annotations

import collections
import dataclasses
import os
from typing import Sequence

import numpy as np

from dpsynrag_jax import digests
from dpsynrag_jax import evaluation
from dpsynrag_jax import evaluation_artifacts as artifacts
from dpsynrag_jax.data.tasks import Task, load_task
from dpsynrag_jax.evaluation import evaluate
from dpsynrag_jax.rag import answer as rag_answer
from dpsynrag_jax.rag import index as rag_index
from dpsynrag_jax.synrag import pipeline
from dpsynrag_jax.synrag import topics
from dpsynrag_jax.synrag import workdir as wd_lib

PURE = 0.5
TOOL = "funnel"
READS = ("the build's private/ state (cluster members, each cluster's tokens) and the "
         "documents' answers")
TUNING_WARNING = (
    "Tuning settings on private labels is not private: this plan scores candidate settings "
    "with the documents' answers and the build's private cluster members, outside any privacy "
    "ledger, so settings chosen from it depend on the private data. On a private corpus, tune "
    "on public data instead (a public benchmark corpus of the same kind, e.g. Medical Synth; "
    "the validation questions of a public dataset; or a disjoint public sample), then build "
    "once on the private corpus with the chosen settings.")


def _shown_path(build_dir: str) -> str:
  """The build as a funnel names it: relative to the working directory when inside it, so
  that a report published from a work dir names no local absolute path; absolute otherwise."""
  path = os.path.abspath(build_dir)
  relative = os.path.relpath(path)
  return path if relative == os.pardir or relative.startswith(os.pardir + os.sep) else relative


def _share(hits: Sequence[bool]) -> float | None:
  return float(np.mean(hits)) if len(hits) else None


def cluster_texts(build_dir: str, decode, encode=None,
                  leads: list[str] | None = None) -> dict[int, str]:
  """cluster -> its synthetic text as the pipeline released it (private: ties text to cluster,
  whereas the released database drops the texts the filter removed). With topic terms the
  text opens with them: encode (text -> token ids, the build's tokenizer) detokenises them
  with the tokens as the release does; without it they are joined by a space (which can
  differ from the release in spacing only). leads: topic_leads(build_dir), if already read."""
  rows = wd_lib.read_jsonl(os.path.join(build_dir, wd_lib.PRIVATE, "generated.jsonl"))
  leads = topic_leads(build_dir) if leads is None else leads
  if not leads:
    return {r["cluster"]: decode(r["tokens"]).strip() for r in rows}
  if encode is None:
    return {r["cluster"]: f"{leads[r['cluster']]} {decode(r['tokens']).strip()}".strip()
            for r in rows}
  return {r["cluster"]: decode(list(encode(leads[r["cluster"]])) + list(r["tokens"])).strip()
          for r in rows}


def check_documents(build_dir: str, task: Task) -> None:
  """Raises ValueError if the build's private document digest is not that of task.documents."""
  digest = os.path.join(build_dir, wd_lib.PRIVATE, "documents.sha256")
  if os.path.exists(digest) and (open(digest, encoding="utf-8").read().strip() !=
                                 digests.sequence_sha256(task.documents)):
    raise ValueError(f"{build_dir} was built from other documents than the task's.")


def topic_leads(build_dir: str) -> list[str] | None:
  """Each cluster's topic-term opening (private: tied to its cluster), or None without terms."""
  path = os.path.join(build_dir, wd_lib.PRIVATE, pipeline.TOPIC_LEADS)
  leads = wd_lib.read_json(path) if os.path.exists(path) else None
  return leads if leads and any(leads) else None


def recall_of_texts(texts: Sequence[str], task: Task, encoder) -> float:
  """Context recall of a database holding `texts` (top_k by the task's encoder search)."""
  index = rag_index.build_index(encoder.embed(list(texts)))
  _, ids = rag_index.search(index, encoder.embed([q.text for q in task.test]), task.top_k)
  return _share([any(task.matches(texts[i], q.answers) for i in row if i >= 0)
                 for row, q in zip(ids, task.test)])


def topic_controls(build_dir: str, leads: list[str], task: Task, encoder,
                   seed: int = 0) -> list[dict]:
  """Two controls for a build with topic terms (synrag.topics), same questions and search:

    openings only   the database holds each cluster's opening without its tokens: what the
                    drawn terms alone retrieve
    chance          one opening per cluster with each list's terms drawn uniformly (the
                    build's generation.topic_terms, a fixed public seed): the context recall
                    a database of random names of the same form reaches by luck
  """
  spec = wd_lib.read_json(os.path.join(build_dir, wd_lib.CONFIG))["generation"]["topic_terms"]
  groups = topics.parse_spec(spec)
  if topics.needs_discovery(groups):   # uniform over the terms the build discovered
    discovered = wd_lib.read_json(os.path.join(build_dir, wd_lib.PRIVATE,
                                               pipeline.DISCOVERED_TERMS))
    groups = [g for g in topics.with_discovered(groups, discovered) if g.count]
  chance = topics.uniform_leads(groups, len(leads), seed)
  return [
      {"stage": "context recall, openings only",
       "value": recall_of_texts(leads, task, encoder),
       "of": "test questions", "detail": "each text cut to its topic terms"},
      {"stage": "context recall, chance", "value": recall_of_texts(chance, task, encoder),
       "of": "test questions", "detail": f"{len(chance)} uniformly drawn openings"},
  ]


def cluster_majorities(members: dict, doc_answers) -> tuple[dict, dict]:
  """(cluster -> majority answer, cluster -> purity: the share of S_r holding it) over the
  non-empty clusters; a cluster whose documents have no answer has purity 0 and no majority."""
  majority, purity = {}, {}
  for r, ids in sorted(members.items()):
    if len(ids) == 0:   # lists or arrays of document ids
      continue
    counts = collections.Counter(a for i in ids for a in set(doc_answers[i]))
    if not counts:
      purity[r] = 0.0
      continue
    answer, n = min(counts.items(), key=lambda kv: (-kv[1], kv[0]))   # ties: alphabetical
    majority[r], purity[r] = answer, n / len(ids)
  return majority, purity


def build_funnel(build_dir: str, task: Task, encoder, decode,
                 per_question: dict | None = None, encode=None, reader=None) -> dict:
  """The funnel of the build in `build_dir` against `task`'s test questions.

  A build planned with runtime.stop_after_rerank (clusters chosen, nothing decoded) gives the
  stages up to coverage only.

  Args:
    decode: token ids -> text (the build's tokenizer, `LanguageModel.decode`).
    encode: text -> token ids (the same tokenizer), for topic openings (cluster_texts).
    per_question: the evaluation row's per-question outcomes ("correct", "recalled") for the
      same questions, if answered; the accuracy stages need them.
    reader: (questions, contexts) -> answers; without per_question, answers the questions
      over the contexts the funnel retrieved, for the accuracy stages.
  """
  wd = wd_lib.Workdir(build_dir)
  if not os.path.exists(wd.private_path("selected.jsonl")):
    raise wd_lib.WorkdirError(f"{build_dir} holds no build whose clusters are chosen.")
  check_documents(build_dir, task)
  members = {r["cluster"]: r["members"]
             for r in wd_lib.read_jsonl(wd.private_path("selected.jsonl"))}
  leads = topic_leads(build_dir)
  texts = cluster_texts(build_dir, decode, encode, leads or [])
  majority, purity = cluster_majorities(members, task.document_answers())
  sizes = [len(m) for m in members.values() if m]
  golds = [q.answers for q in task.test]
  majorities = set(majority.values())
  pure = [r for r, p in purity.items() if p >= PURE and r in majority]
  planned = [
      {"stage": "clusters", "value": len(sizes), "of": len(members),
       "detail": f"mean |S_r| {np.mean(sizes):.1f}" if sizes else "all empty"},
      {"stage": "purity >= 0.5", "value": _share([p >= 0.5 for p in purity.values()]),
       "of": "non-empty clusters",
       "detail": (f"median {np.median(list(purity.values())):.2f}; >= 0.8: "
                  f"{_share([p >= 0.8 for p in purity.values()]):.2f}") if purity else ""},
      {"stage": "coverage", "value": _share([any(a in majorities for a in g) for g in golds]),
       "of": "test questions", "detail": f"{len(majorities)} distinct majority answers"},
  ]
  if not wd.finished:
    return {"build": _shown_path(build_dir), "questions": len(golds), "stages": planned}
  released = [r["text"] for r in wd_lib.read_jsonl(wd.path(wd_lib.SYNTHETIC_DB))]
  index = rag_index.load_index(wd.path(wd_lib.INDEX))
  contexts = [[]] * len(golds)
  if released and golds:
    _, ids = rag_index.search(index, encoder.embed([q.text for q in task.test]), task.top_k)
    contexts = [[released[i] for i in row if i >= 0] for row in ids]
  hits = [sum(task.matches(t, g) for t in ctx) for ctx, g in zip(contexts, golds)]
  recalled = [h > 0 for h in hits]
  stages = planned + [
      {"stage": "decode fidelity",
       "value": _share([task.matches(texts.get(r, ""), [majority[r]]) for r in pure]),
       "of": f"clusters with purity >= {PURE}", "detail": f"{len(pure)} clusters"},
      {"stage": "database recall",
       "value": _share([any(task.matches(t, g) for t in released) for g in golds]),
       "of": "test questions", "detail": f"{len(released)} released texts"},
      {"stage": "context recall", "value": _share(recalled), "of": "test questions",
       "detail": f"top-{task.top_k}"},
      # A small reader follows the majority of its context: one right text among several about
      # other answers is often outvoted (the paper_cpu L = 1 ablation: 1.0 right texts per
      # recalled question against 2.6 with L = 5, accuracy given recall 6.5 against 32.8 %).
      {"stage": "context recall, >= 2 texts", "value": _share([h >= 2 for h in hits]),
       "of": "test questions",
       "detail": (f"mean {np.mean([h for h in hits if h]):.2f} right texts per recalled question"
                  if any(hits) else "")},
  ]
  if leads and golds:
    stages += topic_controls(build_dir, leads, task, encoder)
  if per_question is None and reader is not None and golds:
    answers = reader([q.text for q in task.test], contexts)
    per_question = {"correct": [task.matches(a, g) for a, g in zip(answers, golds)]}
  if per_question is not None:
    correct = [bool(c) for c in per_question["correct"]]
    given = [c for c, r in zip(correct, recalled) if r]
    stages += [
        {"stage": "accuracy", "value": _share(correct), "of": "test questions", "detail": ""},
        {"stage": "accuracy | context recall", "value": _share(given),
         "of": "recalled questions", "detail": f"{len(given)} questions"}]
  return {"build": _shown_path(build_dir), "questions": len(golds), "stages": stages}


def value_text(v) -> str:
  """A stage's value as the tables print it: shares in %, counts as they are."""
  return "-" if v is None else (f"{100 * v:.1f} %" if isinstance(v, float) else str(v))


def cell(text) -> str:
  """Text for a markdown table cell: '|' (in "|S_r|", "accuracy | context recall") escaped."""
  return str(text).replace("|", "\\|")


def markdown(funnel: dict, title: str) -> str:
  lines = [f"### {title}", "", "| stage | value | of | |", "|---|---|---|---|"]
  for s in funnel["stages"]:
    lines.append(f"| {cell(s['stage'])} | {value_text(s['value'])} | {cell(s['of'])} | "
                 f"{cell(s['detail'])} |")
  return "\n".join(lines) + "\n"


def headline(funnel: dict) -> str:
  """One line: coverage, database recall, context recall (what `make demo` prints)."""
  by = {s["stage"]: s["value"] for s in funnel["stages"]}
  pct = lambda v: "-" if v is None else f"{100 * v:.0f} %"
  return (f"coverage {pct(by['coverage'])}, database recall {pct(by['database recall'])}, "
          f"context recall {pct(by['context recall'])} of {funnel['questions']} test questions")


def write(path: str, funnel: dict, title: str) -> None:
  """The funnel as an evaluation artifact: JSON at `path` (.json), its table beside it (.md)."""
  artifacts.write_json(path, funnel, TOOL, READS)
  artifacts.write_text(os.path.splitext(path)[0] + ".md", markdown(funnel, title), TOOL, READS)


def run(config, workdir: str) -> list[dict]:
  """Funnels of every (dataset, seed) DP-SynRAG build of an evaluation config, written to each
  build's evaluation/ folder and to workdir/evaluation/."""
  artifacts.announce(TOOL, READS)
  synrag_only = config.copy_and_resolve_references()
  synrag_only.unlock()
  synrag_only.methods = "dp_synrag"
  rows = evaluate.run(synrag_only, workdir, tables=False)   # builds and answers, or reuses
  lm, encoder = evaluation.load_models(config)
  out = []
  for row in rows:
    task = evaluation.load_eval_task(config, row["dataset"])
    build_dir = os.path.join(workdir, row["build"])
    funnel = build_funnel(build_dir, task, encoder, lm.decode, row["per_question"],
                          encode=lambda t: lm.encode([t])[0])
    funnel.update({"dataset": row["dataset"], "seed": row["seed"]})
    title = f"Funnel: DP-SynRAG on {row['dataset']}, seed {row['seed']} ({row['build']})"
    write(artifacts.evaluation_path(build_dir, "funnel.json"), funnel, title)
    write(artifacts.evaluation_path(
        workdir, f"funnel_{row['dataset']}_seed{row['seed']}.json"), funnel, title)
    print(markdown(funnel, title))
    out.append(funnel)
  return out


_TASK_OF_DATA = {"medical_synth": "medical", "movielens": "movielens", "searchqa": "searchqa"}


def plan(config, workdir: str, num_questions: int) -> dict:
  """Clusters of the build config `config` (decoding skipped) scored on validation questions,
  written to workdir/evaluation/plan.json (.md), with TUNING_WARNING printed and in both."""
  artifacts.announce(TOOL, READS)
  print(f"WARNING: {TUNING_WARNING}", flush=True)
  pipeline.plan_build(config, workdir)
  if config.data.name not in _TASK_OF_DATA:
    raise ValueError(f"--plan needs a dataset with gold answers, got {config.data.name!r}.")
  task = load_task(_TASK_OF_DATA[config.data.name], path=config.data.path,
                   num_documents=config.data.num_documents, num_validation=num_questions,
                   num_test=0, seed=config.data.split_seed)
  validation = dataclasses.replace(task, test=task.validation)   # never the test questions
  funnel = build_funnel(workdir, validation, None, None)
  funnel["questions_from"] = "validation"
  funnel["tuning_warning"] = TUNING_WARNING
  title = f"Planned clusters of {workdir} (validation questions)"
  text = markdown(funnel, title) + f"\n**Warning.** {TUNING_WARNING}\n"
  artifacts.write_json(artifacts.evaluation_path(workdir, "plan.json"), funnel, TOOL, READS)
  artifacts.write_text(artifacts.evaluation_path(workdir, "plan.md"), text, TOOL, READS)
  print(text)
  return funnel


def of_build(config, build_dir: str, dataset: str = "medical",
             out: str = "", answer: bool = False, split: str = "test") -> dict:
  """The funnel of a finished build made outside an evaluation (build_synthetic_db,
  bench_build --whole) against the evaluation config's test questions: every stage up to
  context recall, and with `answer` the accuracy stages too (the evaluation's reader: its
  model, reader_prompt and answer_tokens, over the funnel's retrieved texts). Written to the
  build's evaluation/ folder and to `out` (a .json path, a .md beside it; refused beside
  released files: give e.g. docs/results/NAME/evaluation/funnel.json) if given. With split
  'validation', the same number of validation questions instead, written as funnel_validation
  (for choosing settings without reading the test questions)."""
  artifacts.announce(TOOL, READS)
  if out:
    artifacts.check_destination(out)   # before the minutes the funnel takes
  task = evaluation.load_eval_task(config, dataset, split)
  lm, encoder = evaluation.load_models(config)
  prompt = rag_answer.reader_prompt(config.get("reader_prompt", "paper"), task.name)
  reader = (lambda questions, contexts: rag_answer.answer_questions(
      lm, questions, contexts, max_new_tokens=config.answer_tokens, prompt=prompt))
  funnel = build_funnel(build_dir, task, encoder, lm.decode,
                        encode=lambda t: lm.encode([t])[0], reader=reader if answer else None)
  funnel.update({"dataset": dataset, "questions_config": f"{split}, first {len(task.test)}"})
  if split != "test":
    funnel["questions_from"] = split
    for stage in funnel["stages"]:
      if stage["of"] == "test questions":
        stage["of"] = f"{split} questions"
  title = f"Funnel: {build_dir} on {dataset} ({len(task.test)} {split} questions)"
  name = "funnel.json" if split == "test" else f"funnel_{split}.json"
  for path in [artifacts.evaluation_path(build_dir, name)] + ([out] if out else []):
    write(path, funnel, title)
  print(markdown(funnel, title))
  return funnel
