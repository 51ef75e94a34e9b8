"""Where the answers are lost: the utility funnel of a DP-SynRAG build, stage by stage.

    python -m experiments.funnel --config=experiments/configs/evaluate.py:paper_cpu \
        --workdir=runs/paper_cpu/eval
    python -m experiments.funnel --config=experiments/configs/medical_synth.py:demo \
        --workdir=runs/plans/demo --plan --questions=100     # choose settings: see below

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

from absl import app
from absl import flags

from dpsynrag_jax.evaluation import funnel
from experiments import cli


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if flags.FLAGS.build_dir:
    funnel.of_build(cli.FLAGS.config, flags.FLAGS.build_dir, out=flags.FLAGS.json_out,
                    answer=flags.FLAGS.answer)
  elif flags.FLAGS.plan:
    funnel.plan(cli.FLAGS.config, cli.FLAGS.workdir, flags.FLAGS.questions)
  else:
    funnel.run(cli.FLAGS.config, cli.FLAGS.workdir)


if __name__ == "__main__":
  cli.define_config_and_workdir("Evaluation config (or, with --plan, a build config).")
  flags.DEFINE_bool("plan", False, "Choose clusters only and score them on validation "
                    "questions (a build config).")
  flags.DEFINE_integer("questions", 100, "Validation questions scored with --plan.")
  flags.DEFINE_string("build_dir", "", "A finished Medical Synth build made outside the "
                      "evaluation: its funnel up to context recall on the evaluation config's "
                      "test questions (--workdir is not used).")
  flags.DEFINE_bool("answer", False, "With --build_dir: also answer the test questions with "
                    "the evaluation's reader over the retrieved texts (the accuracy stages).")
  flags.DEFINE_string("json_out", "", "With --build_dir: also write the funnel here (.json, "
                      "and .md beside it); an evaluation artifact, refused beside released "
                      "files (e.g. docs/results/NAME/evaluation/funnel.json).")
  cli.run(main)
