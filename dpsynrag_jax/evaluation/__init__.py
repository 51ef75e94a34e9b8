"""The evaluation harness: methods built from an evaluation config, scored on a task.

An evaluation config (experiments/configs/evaluate.py) names methods, datasets and seeds; this
package turns one (method, task, seed) into a `baselines.Method` (`make_method`), the
DP-SynRAG pipeline config the evaluation derives for it (`synrag_config`) and the work dir of
that build (`synrag_build_dir`: one per config digest, shared by every app in a work dir),
the settings that decide a result row (`method_settings`, keyed by `settings_digest`), and the
row itself (`evaluate_method`: accuracy, context recall, leakage, epsilon), and the loop over
methods, datasets and seeds that writes the tables (`evaluate.run`). The experiment apps
(experiments/) parse flags and call these.

What an evaluation releases is public settings only. The DP-SynRAG build config carries the
evaluation config's own num_documents (a cap, 0 = all) and no local path: the harness hands the
build its documents (baselines.DPSynRAG(documents=...)). Result rows are keyed by the digest of
public settings (`method_settings`: no measured corpus size, no path). What was measured (the
documents' count and digest, the folder read) stays on the work dir's private side
(`check_eval_data`), which refuses to key rows of other documents under the same settings.

Every noisy method runs in seeded noise mode (NOISE): the rows are reproducible benchmarks, not
private releases (anyone who knows a row's seed can redraw its noise); rows say so ("noise")
and results.json carries BENCHMARK_NOTE.

  methods     make_method, synrag_config, synrag_build_dir, method_settings, settings_digest,
              NOISE, BENCHMARK_NOTE
  scoring     evaluate_method, the resumable answer log, score_answers, rescore_row, SCORING
  inputs      load_models, load_eval_task, check_eval_data
  evaluate    run: methods x datasets x seeds, rows computed or read back, and their tables
  reporting   result rows -> results.json, a markdown table and a bar plot
  funnel      the utility funnel of a DP-SynRAG build, stage by stage

The names of methods, scoring and inputs are importable from the package itself
(`evaluation.make_method`); evaluate, reporting and funnel are imported as modules. A module
setting (scoring.ANSWER_CHUNK) is read where it is defined: set it on its module, not here.
"""

from dpsynrag_jax.evaluation.inputs import check_eval_data, load_eval_task, load_models
from dpsynrag_jax.evaluation.methods import (BENCHMARK_NOTE, METHOD_NAMES, NOISE, NOISELESS,
                                             OWNED_BY_EVALUATION, benchmark_note,
                                             dp_rag_budget, leave_to_evaluation, make_method,
                                             method_settings, settings_digest, split_list,
                                             synrag_build_dir, synrag_config)
from dpsynrag_jax.evaluation.scoring import (ANSWER_CHUNK, SCORING, answer_resumably,
                                             answers_of, evaluate_method, log_answers,
                                             read_answer_log, rescore_row, score_answers)

__all__ = [
    "ANSWER_CHUNK", "BENCHMARK_NOTE", "METHOD_NAMES", "NOISE", "NOISELESS", "OWNED_BY_EVALUATION",
    "SCORING", "answer_resumably", "answers_of", "benchmark_note", "check_eval_data",
    "dp_rag_budget", "evaluate_method", "leave_to_evaluation", "load_eval_task", "load_models",
    "log_answers", "make_method", "method_settings", "read_answer_log", "rescore_row",
    "score_answers", "settings_digest", "split_list", "synrag_build_dir", "synrag_config",
]
