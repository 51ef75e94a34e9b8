"""`make demo`: a DP synthetic database from Medical Synth on the embedded models, then RAG.

    python -m experiments.demo --workdir=runs/demo

1. Builds the database with experiments/configs/medical_synth.py:demo (all 8000 notes,
   SmolLM2-135M, MiniLM, eps = 10; each text opens with its cluster's privately drawn topic
   terms) into WORKDIR/build_<config digest>, unless that finished build is there (an
   interrupted one resumes).
2. Prints the budget spent and a few synthetic texts.
3. Evaluation: the funnel's headline over the first 50 test questions (coverage, database
   recall, context recall: experiments.funnel), then the first 5 test questions answered by
   retrieving from the synthetic texts only, with the gold answer beside each.
The lines marked "evaluation" read the private ground truth to score the result; nothing else
after step 1 touches private data.
"""

import dataclasses
import os
import re
import time

from absl import flags
from absl import logging

from dpsynrag_jax.data.tasks import load_task
from dpsynrag_jax.models import load_encoder, load_lm
from dpsynrag_jax.rag import answer as rag_answer
from dpsynrag_jax.rag import index as rag_index
from dpsynrag_jax.synrag import pipeline
from dpsynrag_jax.synrag import workdir as wd_lib
from experiments import cli
from experiments import funnel
from experiments.configs import medical_synth


def define_flags() -> None:
  """The app's flags, defined when it runs (not on import: apps import side by side)."""
  flags.DEFINE_string("workdir", "runs/demo", "Where the demo's database goes.")
  flags.DEFINE_integer("questions", 5, "Test questions answered and shown.")
  flags.DEFINE_integer("funnel_questions", 50, "Test questions the funnel headline scores.")


def build_dir(config, workdir: str) -> str:
  """The demo's build of `config`: WORKDIR/build_<config digest>, so a changed demo config
  builds next to an old build instead of overwriting it (a rebuild with the same seed would
  share its noise)."""
  return os.path.join(workdir, f"build_{wd_lib.config_digest(config.to_dict())}")


def _reuse_or_build(config, workdir: str, lm, encoder) -> float:
  """Reuses a finished build, resumes an interrupted one, or builds."""
  if wd_lib.Workdir(workdir).holds_finished(config.to_dict()):
    print(f"Reusing the finished build in {workdir} (delete it to build again).")
    return 0.0
  start = time.time()
  pipeline.build_synthetic_db(config, workdir, lm=lm, encoder=encoder)
  return time.time() - start


def run(workdir: str, num_questions: int, funnel_questions: int,
        config_arg: str = "demo") -> dict:
  """config_arg: the medical_synth config ('tiny' in tests). Returns the funnel."""
  start = time.time()
  config = medical_synth.get_config(config_arg)
  workdir = build_dir(config, workdir)
  lm, encoder = load_lm(config.model.lm), load_encoder(config.model.encoder)
  build_seconds = _reuse_or_build(config, workdir, lm, encoder)
  ledger = wd_lib.read_json(os.path.join(workdir, wd_lib.LEDGER))
  records = wd_lib.read_jsonl(os.path.join(workdir, wd_lib.SYNTHETIC_DB))
  totals = ledger["totals"]
  print(f"\n== Privacy: spent epsilon = {totals['eps_closed_form']:.3f} (Theorem 1, zCDP) / "
        f"{totals['eps_dp_accounting_rdp']:.3f} (dp_accounting RDP) at delta = "
        f"{totals['delta']:g}; budget {totals['epsilon_budget']:g}.")
  if config.privacy.noise == "seeded":
    print(f"== Noise: drawn from the public seed {config.seed}, so that this demo prints the same "
          "figures everywhere; anyone who knows the seed can redraw and subtract it, so this "
          "database is a demonstration, not a private release (builds default to "
          "privacy.noise=secret).")
  if build_seconds:
    summary = wd_lib.read_json(os.path.join(workdir, "private", "summary.json"))
    print(f"== Build took {build_seconds / 60:.1f} min; per phase (s): {summary['seconds']}")
  task = load_task("medical", num_documents=config.data.num_documents, num_validation=0,
                   num_test=max(funnel_questions, num_questions), seed=config.data.split_seed)
  diseases = sorted({a for q in task.test for a in q.answers} |
                    {a for d in task.doc_answers for a in d})
  # Whole names only: "Snurfles" is a disease and also the start of "Snurflesauce".
  patterns = [re.compile(rf"\b{re.escape(d)}\b", re.IGNORECASE) for d in diseases]
  naming = [r for r in records if any(p.search(r["text"]) for p in patterns)]
  print(f"== {len(records)} synthetic texts; evaluation: {len(naming)} name a disease of the "
        "corpus, e.g.:")
  for r in naming[:5]:
    print(f"  [{r['keyword']}] {r['text'][:240]}")
  if config.generation.get("topic_terms", ""):
    print("  (every text opens with its cluster's drawn topic terms; a cluster that no note "
          "reached draws them uniformly and its tokens are noise: which clusters those are is "
          "not released)")

  scored = funnel.build_funnel(
      workdir, dataclasses.replace(task, test=task.test[:funnel_questions]), encoder, lm.decode,
      encode=lambda t: lm.encode([t])[0])
  print(f"\n== Evaluation, funnel over the first {funnel_questions} test questions: "
        f"{funnel.headline(scored)}")
  print(funnel.markdown(scored, "Funnel").split("\n", 2)[2])

  index = rag_index.load_index(os.path.join(workdir, wd_lib.INDEX))
  shown = task.test[:num_questions]   # the first ones: not chosen by how they come out
  questions = [q.text for q in shown]
  _, ids = rag_index.search(index, encoder.embed(questions), task.top_k)
  contexts = [[records[i]["text"] for i in row if i >= 0] for row in ids]
  answers = rag_answer.answer_questions(lm, questions, contexts,
                                        prompt=rag_answer.reader_prompt("focused", "medical"))
  print(f"== RAG over the synthetic database (top-{task.top_k}), the first {num_questions} "
        "test questions:")
  correct = 0
  for q, a, ctx in zip(shown, answers, contexts):
    hit = task.matches(a, q.answers)
    correct += hit
    in_context = any(task.matches(c, q.answers) for c in ctx)
    print(f"  Q: {q.text.strip()[:160]}\n  A: {a[:200]}\n  evaluation: gold = {q.answers[0]}, "
          f"{'correct' if hit else 'wrong'}; {'in' if in_context else 'not in'} the retrieved "
          "texts")
  print(f"== Evaluation: {correct}/{len(answers)} answers name the right disease. "
        f"Total {(time.time() - start) / 60:.1f} min.")
  return scored


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  cli.start_app()
  run(flags.FLAGS.workdir, flags.FLAGS.questions, flags.FLAGS.funnel_questions)


if __name__ == "__main__":
  define_flags()
  cli.define_compilation_cache()
  cli.run(main)
