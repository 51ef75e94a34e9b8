"""Builds a DP synthetic database (DP-SynRAG) into a work directory.

    python -m experiments.build_synthetic_db \
        --config=experiments/configs/medical_synth.py:demo --workdir=runs/demo

Killed and restarted with the same flags, it resumes from the last finished cluster.
"""

from absl import app
from absl import flags
from ml_collections import config_flags

from dpsynrag_jax.synrag import pipeline

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file.",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for the run's outputs and state.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  pipeline.build_synthetic_db(_CONFIG.value, _WORKDIR.value)


if __name__ == "__main__":
  app.run(main)
