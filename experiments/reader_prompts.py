"""Which reader prompt the model can follow, on VALIDATION questions only.

    python -m experiments.reader_prompts --config=experiments/configs/evaluate.py:paper_cpu \
        --workdir=runs/paper_cpu/eval --styles=paper,focused --questions=50

RAG over the private documents (the reader's upper bound: the right note is usually
retrieved), the first `questions` validation questions of each dataset, one row per reader
prompt style (rag.answer.READER_PROMPTS): accuracy, context recall and accuracy given context
recall. Test questions are never read, so choosing the evaluation's `reader_prompt` from this
table does not tune on them. Writes WORKDIR/reader_prompts.json and .md (resumable per style).
"""

from __future__ import annotations

import json
import os

from absl import app
from absl import flags

from dpsynrag_jax import baselines
from dpsynrag_jax import evaluation
from dpsynrag_jax.data.tasks import load_task
from dpsynrag_jax.rag import answer as rag_answer
from dpsynrag_jax.rag import metrics
from dpsynrag_jax.synrag import workdir as wd_lib
from experiments import cli


def define_flags() -> None:
  cli.define_config_and_workdir("Evaluation config.")
  flags.DEFINE_list("styles", ["paper", "focused"], "Reader prompt styles to compare.")
  flags.DEFINE_integer("questions", 50, "Validation questions per dataset.")


def score(task, questions, answers, contexts) -> dict:
  golds = [q.answers for q in questions]
  recalled = [any(task.matches(c, g) for c in ctx) for ctx, g in zip(contexts, golds)]
  correct = [task.matches(a, g) for a, g in zip(answers, golds)]
  given = [c for c, r in zip(correct, recalled) if r]
  return {"accuracy": metrics.accuracy(answers, golds, task.matches),
          "context_recall": sum(recalled) / len(recalled),
          "accuracy_given_recall": sum(given) / len(given) if given else None,
          "examples": [{"question": q.text, "gold": list(q.answers), "answer": a}
                       for q, a in list(zip(questions, answers))[:3]]}


def run(config, workdir: str, styles, num_questions: int) -> list[dict]:
  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, "reader_prompts.jsonl")
  done = {(r["dataset"], r["style"], r["questions"]): r for r in wd_lib.read_jsonl(path)}
  lm, encoder = evaluation.load_models(config)
  rows = []
  for dataset in evaluation.split_list(config.datasets):
    task = load_task(dataset, path=config.paths.get(dataset, ""),
                     num_documents=config.num_documents, num_validation=num_questions,
                     num_test=0, seed=0)
    questions = list(task.validation[:num_questions])
    rag = baselines.RAG(lm, encoder, task, max_new_tokens=config.answer_tokens)
    rag.build()
    contexts = rag.retriever.retrieve([q.text for q in questions], task.top_k)
    for style in styles:
      if (dataset, style, len(questions)) in done:
        rows.append(done[(dataset, style, len(questions))])
        continue
      answers = rag_answer.answer_questions(
          lm, [q.text for q in questions], contexts, max_new_tokens=config.answer_tokens,
          prompt=rag_answer.reader_prompt(style, task.name))
      row = {"dataset": dataset, "style": style, "questions": len(questions),
             **score(task, questions, answers, contexts)}
      wd_lib.append_jsonl(path, [row])
      rows.append(row)
  pct = lambda v: "-" if v is None else f"{100 * v:.1f}"
  lines = ["### Reader prompts: RAG on validation questions", "",
           "| dataset | prompt | questions | accuracy % | context recall % | "
           "accuracy given recall % |", "|---|---|---|---|---|---|"]
  lines += [f"| {r['dataset']} | {r['style']} | {r['questions']} | {pct(r['accuracy'])} | "
            f"{pct(r['context_recall'])} | {pct(r['accuracy_given_recall'])} |" for r in rows]
  with open(os.path.join(workdir, "reader_prompts.md"), "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")
  with open(os.path.join(workdir, "reader_prompts.json"), "w", encoding="utf-8") as f:
    json.dump(rows, f, indent=1)
  print("\n".join(lines))
  return rows


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  run(cli.FLAGS.config, cli.FLAGS.workdir, flags.FLAGS.styles, flags.FLAGS.questions)


if __name__ == "__main__":
  define_flags()
  cli.run(main)
