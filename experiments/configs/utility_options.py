"""This project's utility options, one at a time, against the paper's method at eps 3 and 10.

    python -m experiments.ablations --config=experiments/configs/utility_options.py:ARG \
        --workdir=runs/eval

ARG is an evaluation config arg (tiny, cpu, paper; experiments/configs/evaluate.py). Variants
(experiments/ablations.py): full (the paper), rdp (calibration through the RDP accountant),
public_prior (omega = 0.1), difference (difference clipping), candidates (public top-50 plus
the task's public terms), synonyms (keyword merging by public-encoder cosine >= 0.7). Every
variant spends the same (eps, delta); the ledger says so in the 'epsilon spent' column.
"""

import ml_collections

from experiments.configs import evaluate

APP = "experiments.ablations"   # what launch.sweep runs with this config


def get_config(arg: str = "cpu") -> ml_collections.ConfigDict:
  config = evaluate.get_config(arg)
  config.methods = "dp_synrag"
  config.num_attacks = 0
  config.report = "utility_options"
  config.title = "Utility options against the paper's method"
  config.variants = "full,rdp,public_prior,difference,candidates,synonyms"
  config.epsilons = "10,3"
  if arg == "tiny":
    config.epsilons = "3"   # one budget keeps CI short; the full method's build is shared
  return config


# Sweeps: seeds or models, as every derived config.
get_sweep = evaluate.get_seed_or_model_sweep
