"""DP-SynRAG ablations: without re-ranking, without the self-filter, hard clustering (L = 1).

    python -m experiments.ablations --config=experiments/configs/ablations.py:ARG --workdir=runs/eval

ARG is an evaluation config arg (tiny, cpu, paper; experiments/configs/evaluate.py). Give the
evaluation's work dir to reuse its full-method build. `variants` is comma-separated from:
  full            the method as configured
  no_rerank       S_r = C_r: no embedding re-ranking (its budget share stays unspent)
  no_self_filter  every synthetic text is released
  self_filter     the filter on (for configs whose full method has it off)
  hard            L = 1: each document in one cluster only
  synonyms        keywords with public-encoder cosine >= 0.7 share a cluster (beyond the paper)
"""

import ml_collections

from experiments.configs import evaluate

APP = "experiments.ablations"   # what launch.sweep runs with this config


def get_config(arg: str = "cpu") -> ml_collections.ConfigDict:
  config = evaluate.get_config(arg)
  config.methods = "dp_synrag"
  config.num_attacks = 0
  config.report = "ablations"
  config.title = "DP-SynRAG ablations"
  config.epsilons = ""   # comma-separated budgets; empty: config.epsilon (read when run)
  config.variants = "full,no_rerank,no_self_filter,hard"
  config.funnel = True   # each variant's funnel beside its row (<report>_funnel.md)
  if arg in ("cpu", "paper_cpu"):
    # SmolLM2-135M cannot judge YES/NO, so these configs run without the filter and its
    # ablation would compare two unfiltered runs (BUILD_NOTES.md). L = 1 first: without
    # re-ranking S_r = C_r holds every document of the keyword, several times the rows.
    config.variants = "full,hard,no_rerank"
  return config


# Sweeps: seeds or models, as every derived config.
get_sweep = evaluate.get_seed_or_model_sweep
