"""Where the answers are lost: the utility funnel of a DP-SynRAG build, stage by stage.

    python -m experiments.funnel --config=experiments/configs/evaluate.py:paper_cpu \
        --workdir=runs/paper_cpu/eval
    python -m experiments.funnel --config=experiments/configs/medical_synth.py:demo \
        --workdir=runs/plans/demo --plan --questions=100     # choose settings: see below
    python -m experiments.funnel --config=experiments/configs/evaluate.py:paper_cpu \
        --build_dir=runs/my_build --answer --split=validation  # a finished build, validation

What each stage measures, the plan mode and where the reports go: the docstring of
dpsynrag_jax/evaluation/funnel.py, printed below.
"""

from __future__ import annotations

from absl import app
from absl import flags

from dpsynrag_jax.evaluation import funnel
from experiments import cli

__doc__ += "\n" + funnel.__doc__   # --help shows the stages, written once


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if flags.FLAGS.build_dir:
    funnel.of_build(cli.FLAGS.config, flags.FLAGS.build_dir, dataset=flags.FLAGS.dataset,
                    out=flags.FLAGS.json_out, answer=flags.FLAGS.answer, split=flags.FLAGS.split)
  elif flags.FLAGS.plan:
    funnel.plan(cli.FLAGS.config, cli.FLAGS.workdir, flags.FLAGS.questions)
  else:
    funnel.run(cli.FLAGS.config, cli.FLAGS.workdir)


if __name__ == "__main__":
  cli.define_config_and_workdir("Evaluation config (or, with --plan, a build config).")
  flags.DEFINE_bool("plan", False, "Choose clusters only and score them on validation "
                    "questions (a build config).")
  flags.DEFINE_integer("questions", 100, "Validation questions scored with --plan.")
  flags.DEFINE_string("build_dir", "", "A finished build made outside the "
                      "evaluation: its funnel up to context recall on the evaluation config's "
                      "test questions (--workdir is not used).")
  flags.DEFINE_string("dataset", "medical", "With --build_dir: the dataset the build read "
                      "(medical, movielens, searchqa; its path from the evaluation config).")
  flags.DEFINE_enum("split", "test", ["test", "validation"], "With --build_dir: score the "
                    "first num_test questions of this split (validation: choose settings "
                    "without reading the test questions).")
  flags.DEFINE_bool("answer", False, "With --build_dir: also answer the test questions with "
                    "the evaluation's reader over the retrieved texts (the accuracy stages).")
  flags.DEFINE_string("json_out", "", "With --build_dir: also write the funnel here (.json, "
                      "and .md beside it); an evaluation artifact, refused beside released "
                      "files (e.g. docs/results/NAME/evaluation/funnel.json).")
  cli.run(main)
