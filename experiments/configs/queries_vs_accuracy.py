"""Accuracy against the number of questions asked, at a fixed total budget (the paper's Figure 3).

    python -m experiments.queries_vs_accuracy \
        --config=experiments/configs/queries_vs_accuracy.py:ARG --workdir=runs/eval

ARG is an evaluation config arg (tiny, cpu, paper; experiments/configs/evaluate.py). DP-RAG
splits eps_total over the questions a user plans to ask; DP-SynRAG spends it once at build time.
"""

import ml_collections

from experiments.configs import evaluate

APP = "experiments.queries_vs_accuracy"   # what launch.sweep runs with this config


def get_config(arg: str = "cpu") -> ml_collections.ConfigDict:
  config = evaluate.get_config(arg)
  config.num_attacks = 0
  config.query_counts = "1,5,10,15,20"   # questions planned per session
  config.epsilons = "3,5,10,20"          # eps_total of DP-RAG and DP-SynRAG
  config.num_questions = 100             # questions scored per point, asked in sessions
  if arg == "cpu":
    config.epsilons = "3,10"
    config.num_questions = 20
  elif arg in ("paper_cpu", "movielens_cpu"):
    config.epsilons = "10"
    config.query_counts = "1,5,10,20"
    # The first 50 / 40 test questions: a DP-RAG question costs ~30 s on a 2-core CPU and each
    # n asks them all again; flat points read evaluate's per-question scores of the same ones.
    config.num_questions = 50 if arg == "paper_cpu" else 40
  elif arg == "tiny":
    config.query_counts = "1,3"
    config.epsilons = "3,10"
    config.num_questions = 3
  return config


# Sweeps: seeds or models, as every derived config.
get_sweep = evaluate.get_seed_or_model_sweep
