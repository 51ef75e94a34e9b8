"""Builds a DP synthetic database (DP-SynRAG) into a work directory.

    python -m experiments.build_synthetic_db \
        --config=experiments/configs/medical_synth.py:demo --workdir=runs/demo

Killed and restarted with the same flags, it resumes from the last finished cluster.

New documents later (a disjoint set: new people), appended as a partition of their own with the
first build's settings; the texts already released are not touched:

    python -m experiments.build_synthetic_db --workdir=runs/demo --append=new_docs.jsonl
"""

import json
import os

from absl import app
from absl import flags

from dpsynrag_jax import privacy
from dpsynrag_jax.synrag import pipeline
from dpsynrag_jax.synrag import refresh
from dpsynrag_jax.synrag import workdir as wd_lib
from experiments import cli


def sweep_rows(config, workdir: str) -> list[dict]:
  """A finished build's row for launch.sweep's tables: texts released and epsilon spent, read
  back from the released files and the privacy ledger."""
  del config
  wd = wd_lib.Workdir(workdir)
  ledger = privacy.PrivacyLedger.load(wd.path(wd_lib.LEDGER))
  seconds = None
  if os.path.exists(wd.private_path("summary.json")):
    with open(wd.private_path("summary.json"), encoding="utf-8") as f:
      seconds = round(sum(json.load(f)["seconds"].values()), 1)
  return [{"synthetic_texts": len(wd_lib.read_jsonl(wd.path(wd_lib.SYNTHETIC_DB))),
           "ledger_eps_closed_form": ledger.spent_epsilon("closed_form"),
           "ledger_eps_rdp": ledger.spent_epsilon("rdp"), "seconds": seconds}]


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  cli.start_app()
  if cli.FLAGS.append:
    if cli.FLAGS.config is not None:
      raise app.UsageError("--append reuses the work dir's own config; drop --config.")
    released = refresh.append_documents(cli.FLAGS.workdir, cli.FLAGS.append)
    print(json.dumps(released["per_document"], indent=1))
    return
  if cli.FLAGS.config is None:
    raise app.UsageError("--config is required (unless --append).")
  pipeline.build_synthetic_db(cli.FLAGS.config, cli.FLAGS.workdir)


if __name__ == "__main__":
  cli.define_config_and_workdir("Experiment config file.", config_required=False)
  cli.define_compilation_cache()
  flags.DEFINE_string("append", "", "A JSONL/CSV of new documents to add to the finished "
                      "build in --workdir as a new partition.")
  cli.run(main)
