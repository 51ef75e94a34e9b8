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
from launch import grid

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


def get_sweep(name: str) -> list[dict]:
  """Override dicts, one per run: 'seeds' (0..4, one run each) or 'models' (the paper's three
  readers and generators; for accelerators)."""
  sweeps = {
      "seeds": lambda: grid.product({"seeds": ["0", "1", "2", "3", "4"]}),
      "models": lambda: grid.product({"model.lm": list(evaluate.PAPER_MODELS)}),
  }
  if name not in sweeps:
    raise ValueError(f"Unknown sweep {name!r}; expected one of {sorted(sweeps)}.")
  return sweeps[name]()
