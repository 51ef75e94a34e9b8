"""What term discovery keeps at each budget (an evaluation artifact; see the library docstring).

    python -m experiments.term_discovery --config=experiments/configs/evaluate.py:searchqa_cpu \
        --config.paths.searchqa=/data/searchqa \
        --config.dp_synrag.generation.topic_terms=discovered:4 --dataset=searchqa \
        --epsilons=3,5,10 --json_out=runs/searchqa/evaluation/term_discovery.json
"""

from __future__ import annotations

import os

from absl import app
from absl import flags
from ml_collections import config_flags

from dpsynrag_jax import evaluation_artifacts as artifacts
from dpsynrag_jax.evaluation import term_discovery
from experiments import cli

__doc__ += "\n" + term_discovery.__doc__


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  f = flags.FLAGS
  artifacts.announce(term_discovery.TOOL, term_discovery.READS)
  rep = term_discovery.report(cli.FLAGS.config, f.dataset, [float(e) for e in f.epsilons])
  text = term_discovery.markdown(rep)
  print(text)
  if f.json_out:
    artifacts.write_json(f.json_out, rep, term_discovery.TOOL, term_discovery.READS)
    artifacts.write_text(os.path.splitext(f.json_out)[0] + ".md", text, term_discovery.TOOL,
                         term_discovery.READS)


if __name__ == "__main__":
  config_flags.DEFINE_config_file("config", None, "Evaluation config "
                                  "(experiments/configs/evaluate.py).", lock_config=True)
  flags.mark_flag_as_required("config")
  flags.DEFINE_string("dataset", "medical", "medical, movielens or searchqa.")
  flags.DEFINE_list("epsilons", ["3", "5", "10"], "Budgets to report.")
  flags.DEFINE_string("json_out", "", "Also write the report here (.json and .md beside it); "
                      "refused beside released files.")
  cli.run(main)
