"""`make demo`: a DP synthetic database from all 8000 Medical Synth notes, then RAG over it.

    python -m experiments.demo --workdir=runs/demo                          # make demo
    python -m experiments.demo --preset=demo_paper --workdir=runs/demo     # make demo-paper

1. Builds the database with experiments/configs/medical_synth.py:PRESET into
   WORKDIR/build_<config digest>, unless that finished build is there (an interrupted one
   resumes). `demo`: the paper's clustering with openings-only texts (each text is its
   cluster's disease and symptoms, drawn by exponential mechanisms), minutes on a CPU.
   `demo_paper`: the paper's own method, private token decode included, on a 1000-note subset.
2. Prints the budget spent and the first released texts, in release order.
3. Evaluation: the funnel over the first 100 test questions (coverage, database recall,
   context recall, accuracy of the reader over the retrieved synthetic texts), then the first
   5 of those questions with their answers and gold answers.
4. Prints how the paper's method did at the paper's scale, read from the committed
   docs/results/paper_cpu/results.json (not recomputed here), and the command that rebuilds it.
Lines marked "evaluation" read the private ground truth to score the result; nothing else
after step 1 touches private data.
"""

import gc
import json
import os
import time

from absl import flags
from absl import logging
import jax

from dpsynrag_jax import host_memory
from dpsynrag_jax.data.tasks import load_task
from dpsynrag_jax.evaluation import funnel
from dpsynrag_jax.models import load_encoder, load_lm
from dpsynrag_jax.rag import answer as rag_answer
from dpsynrag_jax.synrag import pipeline
from dpsynrag_jax.synrag import workdir as wd_lib
from experiments import cli
from experiments.configs import medical_synth

# The committed paper-scale evaluation the demo quotes, and the command that made it.
PAPER_RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                             "docs", "results", "paper_cpu", "results.json")
PAPER_COMMAND = ("python -m experiments.evaluate --config=experiments/configs/evaluate.py:"
                 "paper_cpu --workdir=runs/paper_cpu/eval")
SHOWN_TEXTS = 5
# The reader's prompts (10 texts and a question) reach 589 tokens; prefilled in one call, 16 at
# a time, they took the demo's peak resident memory from 2.1 to 3.9 GB. 8 rows in chunks of
# 128 tokens: 2.4 GB for the reader alone, and the same 100 answers as one call (measured).
READER_BATCH = 8
READER_PREFILL_CHUNK = 128


def define_flags() -> None:
  """The app's flags, defined when it runs (not on import: apps import side by side)."""
  flags.DEFINE_string("workdir", "runs/demo", "Where the demo's database goes.")
  flags.DEFINE_enum("preset", "demo", ["demo", "demo_paper"],
                    "The experiments/configs/medical_synth.py preset to build.")
  flags.DEFINE_integer("questions", 5, "Test questions shown with their answers (the first "
                       "ones of those the funnel scores).")
  flags.DEFINE_integer("funnel_questions", 100, "Test questions the funnel and accuracy score.")


def build_dir(config, workdir: str) -> str:
  """The demo's build of `config`: WORKDIR/build_<config digest>, so a changed demo config
  builds next to an old build instead of overwriting it (a rebuild with the same seed would
  share its noise)."""
  return os.path.join(workdir, f"build_{wd_lib.config_digest(config.to_dict())}")


def _reuse_or_build(config, workdir: str, lm, encoder) -> float:
  """Reuses a finished build, resumes an interrupted one, or builds. Returns the seconds."""
  if wd_lib.Workdir(workdir).holds_finished(config.to_dict()):
    print(f"Reusing the finished build in {workdir} (delete it to build again).")
    return 0.0
  start = time.time()
  pipeline.build_synthetic_db(config, workdir, lm=lm, encoder=encoder)
  # The build's compiled programs (embedding buckets, re-ranking) are not needed again; freed,
  # they leave room for the reader's (the demo's peak memory is the reader's).
  jax.clear_caches()
  gc.collect()
  host_memory.release_freed_memory()
  return time.time() - start


def one_line(record: dict) -> str:
  """A released record as the demo shows it: its keyword, then its text on one line."""
  return f"[{record['keyword']}] {' '.join(record['text'].split())[:240]}"


def _print_release(config, workdir: str, build_seconds: float) -> None:
  """What was released: the budget spent and the first texts, all public."""
  totals = wd_lib.read_json(os.path.join(workdir, wd_lib.LEDGER))["totals"]
  print(f"\n== Privacy: spent epsilon = {totals['eps_closed_form']:.3f} (Theorem 1, zCDP) / "
        f"{totals['eps_dp_accounting_rdp']:.3f} (dp_accounting RDP) at delta = "
        f"{totals['delta']:g}; budget {totals['epsilon_budget']:g} under the "
        f"{config.privacy.accountant} accountant.")
  if config.privacy.noise == "seeded":
    print("== Noise: drawn from the public seed, so that this demo prints the same figures "
          "everywhere; anyone who knows the seed can redraw and subtract it, so this database "
          "is a demonstration, not a private release (builds default to privacy.noise=secret).")
  if build_seconds:
    summary = wd_lib.read_json(os.path.join(workdir, "private", "summary.json"))
    print(f"== Build took {build_seconds / 60:.1f} min; per phase (s): {summary['seconds']}")
  records = wd_lib.read_jsonl(os.path.join(workdir, wd_lib.SYNTHETIC_DB))
  print(f"== {len(records)} synthetic texts released (synthetic_db.jsonl); the first "
        f"{min(SHOWN_TEXTS, len(records))}, in release order:")
  for r in records[:SHOWN_TEXTS]:
    print(f"  {one_line(r)}")


def _paper_scale() -> None:
  """The paper's method at the paper's scale, from the committed results (not recomputed)."""
  if not os.path.exists(PAPER_RESULTS):
    print(f"\n== ({PAPER_RESULTS} is not in this checkout: no paper-scale figures to quote.)")
    return
  with open(PAPER_RESULTS) as f:
    rows = {r["method"]: r for r in json.load(f)["rows"]}
  print("\n== The paper's own method at the paper's scale (all 8000 notes, Table 6 settings, "
        "the same models), from the committed docs/results/paper_cpu/results.json, NOT "
        "recomputed by this demo:")
  for method in ("DP-SynRAG", "DP-RAG", "DP-Synth", "RAG", "Non-RAG"):
    if method in rows:
      r = rows[method]
      recall = r.get("context_recall")
      print(f"  {method:10s} eps {r['epsilon']:>7.4g}  accuracy {100 * r['accuracy']:5.1f} %  "
            f"context recall {'-' if recall is None else f'{100 * recall:.0f} %'}  "
            f"({r['questions']} test questions)")
  print(f"  Rebuild it (hours on a 2-core CPU): {PAPER_COMMAND}")
  print("  The paper's private token decode on a small subset, in minutes: make demo-paper")


def run(workdir: str, num_questions: int, funnel_questions: int,
        config_arg: str = "demo") -> dict:
  """config_arg: the medical_synth preset ('tiny' in tests). Returns the funnel."""
  if not 0 < num_questions <= funnel_questions:
    raise ValueError(f"--questions must be in 1..--funnel_questions ({funnel_questions}), "
                     f"got {num_questions}.")
  start = time.time()
  config = medical_synth.get_config(config_arg)
  workdir = build_dir(config, workdir)
  lm, encoder = load_lm(config.model.lm), load_encoder(config.model.encoder)
  build_seconds = _reuse_or_build(config, workdir, lm, encoder)
  _print_release(config, workdir, build_seconds)

  task = load_task("medical", num_documents=config.data.num_documents, num_validation=0,
                   num_test=funnel_questions, seed=config.data.split_seed)
  prompt = rag_answer.reader_prompt("focused", "medical")
  read = {}

  def reader(questions, contexts):
    read["contexts"] = contexts
    read["answers"] = rag_answer.answer_questions(
        lm, questions, contexts, prompt=prompt, batch_size=READER_BATCH,
        prefill_chunk=READER_PREFILL_CHUNK)
    return read["answers"]

  scored = funnel.build_funnel(workdir, task, encoder, lm.decode,
                               encode=lambda t: lm.encode([t])[0], reader=reader)
  stages = {s["stage"]: s["value"] for s in scored["stages"]}
  print(f"\n== Evaluation over the first {len(task.test)} test questions (reads the private "
        f"ground truth): {funnel.headline(scored)}; accuracy {100 * stages['accuracy']:.1f} % "
        f"(SmolLM2 reader over the top-{task.top_k} synthetic texts)")
  print(funnel.markdown(scored, "Funnel").split("\n", 2)[2])

  print(f"== RAG over the synthetic database, the first {num_questions} test questions (not "
        "chosen):")
  for q, a, ctx in list(zip(task.test, read["answers"], read["contexts"]))[:num_questions]:
    hit = task.matches(a, q.answers)
    in_context = any(task.matches(c, q.answers) for c in ctx)
    print(f"  Q: {q.text.strip()[:160]}\n  A: {a[:200]}\n  evaluation: gold = {q.answers[0]}, "
          f"{'correct' if hit else 'wrong'}; {'in' if in_context else 'not in'} the retrieved "
          "texts")
  _paper_scale()
  print(f"\n== Total {(time.time() - start) / 60:.1f} min, peak resident memory "
        f"{host_memory.peak_resident_gb():.2f} GiB. Ask the database yourself: "
        f"python -m experiments.ask --db={workdir} --question=\"...\"")
  return scored


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  cli.start_app()
  run(flags.FLAGS.workdir, flags.FLAGS.questions, flags.FLAGS.funnel_questions,
      flags.FLAGS.preset)


if __name__ == "__main__":
  define_flags()
  cli.define_compilation_cache()
  cli.run(main)
