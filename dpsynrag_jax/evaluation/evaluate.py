"""Methods x datasets x seeds: the evaluation's rows, computed or read back, and its tables.

`run` writes WORKDIR/results.jsonl (one row per dataset, method, seed and method settings,
appended as each finishes, so a rerun skips finished rows), results.json, table.md and
accuracy.png. A row is keyed by a digest of everything that decides its result
(`method_settings`): a rerun with other settings in the same work dir computes new rows, and the
tables show the current settings' rows only. DP-SynRAG builds go to
WORKDIR/dp_synrag/<dataset>_seed<s>_<config digest>/ and are shared by every app run in the same
work dir with an equal pipeline config. Answers are logged every ANSWER_CHUNK questions to
WORKDIR/private/answers/<row key>/ (they hold the texts each answer saw), so a rerun after a
crash continues inside a method too, with the same answers and keys.

Rows are keyed by public settings only (no corpus size, no local path); what was read for each
dataset is recorded under WORKDIR/private/data/ (check_eval_data). Every noisy method draws
seeded noise (NOISE): the rows are reproducible benchmarks, and say so.
"""

from __future__ import annotations

import os

from absl import logging

from dpsynrag_jax.evaluation import reporting
from dpsynrag_jax.evaluation.inputs import check_eval_data, load_eval_task, load_models
from dpsynrag_jax.evaluation.methods import (METHOD_NAMES, benchmark_note, make_method,
                                             method_settings, settings_digest, split_list)
from dpsynrag_jax.evaluation.scoring import SCORING, evaluate_method, rescore_row
from dpsynrag_jax.synrag import workdir as wd_lib


def run(config, workdir: str, tables: bool = True) -> list[dict]:
  """Every (dataset, seed, method) row of `config`, computed or read back; with `tables`, also
  results.json, table.md and accuracy.png of exactly these rows."""
  os.makedirs(workdir, exist_ok=True)
  results_path = os.path.join(workdir, "results.jsonl")
  history = wd_lib.read_jsonl(results_path)
  by_key = {r["settings"]: r for r in history if "settings" in r}
  rows = []   # this config's rows, in the order they are listed
  lm, encoder = load_models(config)
  for dataset in split_list(config.datasets):
    task = load_eval_task(config, dataset)
    check_eval_data(workdir, config, dataset, task)
    attacks = task.attack_queries[:config.get("num_attacks", 0)]
    num_queries = len(task.test) + len(attacks)
    for seed in [int(s) for s in split_list(config.seeds)]:
      for name in split_list(config.methods):
        if name not in METHOD_NAMES:
          raise ValueError(f"Unknown method {name!r}; expected one of {sorted(METHOD_NAMES)}.")
        key = settings_digest(method_settings(name, config, task, seed, num_queries))
        # Answers are logged as they come (private: the texts each answer saw), so a run cut
        # off mid-method resumes from its last logged chunk.
        log_dir = os.path.join(workdir, wd_lib.PRIVATE, "answers", key)
        if key in by_key and by_key[key].get("scoring", 1) != SCORING:
          rescored = rescore_row(by_key[key], task, task.test, attacks, log_dir)
          if rescored is None:
            logging.warning("%s on %s, seed %d: scored by older answer matchers and its "
                            "answer log is incomplete; the row is kept as it was scored.",
                            METHOD_NAMES[name], dataset, seed)
          else:
            logging.info("%s on %s, seed %d: scored again from its answer log (matchers "
                         "version %d).", METHOD_NAMES[name], dataset, seed, SCORING)
            wd_lib.append_jsonl(results_path, [rescored])
            by_key[key] = rescored
        if key in by_key:
          rows.append(by_key[key])
          continue
        logging.info("Evaluating %s on %s, seed %d.", METHOD_NAMES[name], dataset, seed)
        method = make_method(name, config, task, lm, encoder, seed, workdir, num_queries)
        row = {"dataset": dataset, "method": METHOD_NAMES[name], "seed": seed,
               "settings": key, **evaluate_method(method, task, task.test, attacks, log_dir)}
        if name == "dp_synrag":
          row["build"] = os.path.relpath(method.workdir, workdir)
        wd_lib.append_jsonl(results_path, [row])
        rows.append(row)
        by_key[key] = row
        logging.info("%s", {k: v for k, v in row.items()
                            if "examples" not in k and k != "per_question"})
  if tables:
    reporting.write_tables(rows, workdir, title="Methods x datasets (mean +- std over seeds)",
                           note=benchmark_note(rows))
  return rows
