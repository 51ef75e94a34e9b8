"""`make demo`: a DP synthetic database from Medical Synth on the embedded models, then RAG.

    python -m experiments.demo --workdir=runs/demo

1. Builds the database with experiments/configs/medical_synth.py:demo (2000 notes, SmolLM2-135M,
   MiniLM, eps = 10) unless the work directory already holds that finished build.
2. Prints the budget spent and the synthetic texts.
3. Answers 5 held-out patients' questions by retrieving from the synthetic texts only.
The lines marked "evaluation" read the private ground truth to score the result; nothing else
after step 1 touches private data.
"""

import collections
import json
import os
import re
import time

from absl import app
from absl import flags
from absl import logging

from dpsynrag_jax.data import load_medical_synth
from dpsynrag_jax.models import load_encoder, load_lm
from dpsynrag_jax.rag import answer as rag_answer
from dpsynrag_jax.rag import index as rag_index
from dpsynrag_jax.synrag import pipeline
from dpsynrag_jax.synrag import workdir as wd_lib
from experiments.configs import medical_synth


def define_flags() -> None:
  """The app's flags, defined when it runs (not on import: apps import side by side)."""
  flags.DEFINE_string("workdir", "runs/demo", "Where the demo's database goes.")
  flags.DEFINE_integer("questions", 5, "Held-out questions to answer.")
  flags.DEFINE_integer("top_k", 10, "Synthetic texts retrieved per question.")


def build_dir(config, workdir: str) -> str:
  """The demo's build of `config`: WORKDIR/build_<config digest>, so a changed demo config
  builds next to an old build instead of overwriting it (a rebuild with the same seed would
  share its noise)."""
  return os.path.join(workdir, f"build_{wd_lib.config_digest(config.to_dict())}")


def _reuse_or_build(config, workdir: str) -> float:
  """Reuses a finished build, resumes an interrupted one, or builds."""
  if wd_lib.Workdir(workdir).holds_finished(config.to_dict()):
    print(f"Reusing the finished build in {workdir} (delete it to build again).")
    return 0.0
  start = time.time()
  pipeline.build_synthetic_db(config, workdir)
  return time.time() - start


def run(workdir: str, num_questions: int, top_k: int, config_arg: str = "demo") -> None:
  """config_arg: the medical_synth config ('tiny' in tests)."""
  config = medical_synth.get_config(config_arg)
  workdir = build_dir(config, workdir)
  build_seconds = _reuse_or_build(config, workdir)
  ledger = json.load(open(os.path.join(workdir, wd_lib.LEDGER)))
  records = wd_lib.read_jsonl(os.path.join(workdir, wd_lib.SYNTHETIC_DB))
  totals = ledger["totals"]
  print(f"\n== Privacy: spent epsilon = {totals['eps_closed_form']:.3f} (Theorem 1, zCDP) / "
        f"{totals['eps_dp_accounting_rdp']:.3f} (dp_accounting RDP) at delta = "
        f"{totals['delta']:g}; budget {totals['epsilon_budget']:g}.")
  if build_seconds:
    summary = wd_lib.read_json(os.path.join(workdir, "private", "summary.json"))
    print(f"== Build took {build_seconds / 60:.1f} min; per phase (s): {summary['seconds']}")
  print(f"== {len(records)} synthetic texts, e.g.:")
  for r in records[:6]:
    print(f"  [{r['keyword']}] {r['text'][:300]}")

  data = load_medical_synth(num_documents=config.data.num_documents, num_validation=0,
                            num_test=num_questions, seed=config.data.split_seed)
  frequent = collections.Counter(data.doc_diseases).most_common(5)
  # Whole names only: "Snurfles" is a disease and also the start of "Snurflesauce".
  patterns = [re.compile(rf"\b{re.escape(d)}\b", re.IGNORECASE) for d in data.diseases]
  naming = [r for r in records if any(p.search(r["text"]) for p in patterns)]
  print(f"\n== Evaluation: {len(naming)} of {len(records)} synthetic texts name a disease of the "
        "corpus. Most frequent diseases in the private subset: "
        + ", ".join(f"{d} ({n} notes)" for d, n in frequent))
  for r in naming[:5]:
    print(f"  names a disease: {r['text'][:200]}")

  encoder = load_encoder(config.model.encoder)
  lm = load_lm(config.model.lm)
  index = rag_index.load_index(os.path.join(workdir, wd_lib.INDEX))
  questions = [q.text for q in data.test]
  _, ids = rag_index.search(index, encoder.embed(questions), top_k)
  contexts = [[records[i]["text"] for i in row if i >= 0] for row in ids]
  answers = rag_answer.answer_questions(lm, questions, contexts)
  print(f"\n== RAG over the synthetic database (top-{top_k}), {num_questions} held-out patients:")
  correct = 0
  for q, a in zip(data.test, answers):
    hit = q.answer.lower() in a.lower()
    correct += hit
    print(f"  Q: {q.text.strip()[:160]}\n  A: {a[:200]}\n  evaluation: gold = {q.answer}, "
          f"{'correct' if hit else 'wrong'}")
  print(f"== Evaluation: {correct}/{len(answers)} answers name the right disease.")


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  run(flags.FLAGS.workdir, flags.FLAGS.questions, flags.FLAGS.top_k)


if __name__ == "__main__":
  define_flags()
  app.run(main)
