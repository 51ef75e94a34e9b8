"""What term discovery keeps at each budget: an evaluation artifact for choosing its settings.

For each epsilon, the build's own calibration (pipeline.calibration_of of the evaluation's
DP-SynRAG config at that epsilon) gives the partition selection's noise and threshold; the
selection is drawn (key: the seeded 'terms' stream of the config's seed) over the documents'
proposals (synrag.discovery), and the report says

  proposed       documents whose own gold answer is among their proposals, and test questions
                 whose answer some document proposes (what discovery could ever find: an
                 answer no document proposes is never released), with the number of
                 documents proposing it (the count the threshold compares)
  answer_terms   test questions whose gold answer a released term names (the task's own
                 answer matcher applied to the term)
  released       the released terms, and the threshold and sigma that released them

It reads the documents' and questions' ground truth, so it is NOT differentially private
(dpsynrag_jax.evaluation_artifacts): for public benchmark corpora only. The build truncates
documents to data.max_doc_tokens first; this report proposes from the whole documents.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from dpsynrag_jax.evaluation.inputs import load_eval_task
from dpsynrag_jax.privacy import partition_selection
from dpsynrag_jax.synrag import discovery
from dpsynrag_jax.synrag import pipeline
from dpsynrag_jax.synrag.vocabulary import english_vocabulary

TOOL = "term_discovery"
READS = "the documents' and test questions' gold answers"


def _share(hits: Sequence[bool]) -> float:
  return round(100.0 * sum(hits) / len(hits), 1) if hits else 0.0


def report(config, dataset: str, epsilons: Sequence[float]) -> dict:
  """The report (module docstring) of evaluation config `config` on `dataset`."""
  task = load_eval_task(config, dataset)
  build = config.dp_synrag.copy_and_resolve_references()
  # The fields the evaluation owns, as its first row fills them.
  build.seed = int(str(config.seeds).split(",")[0])
  build.privacy.delta = float(config.delta)
  d = build.discovery
  vocab = english_vocabulary(build.keywords.vocabulary_size)
  proposed = discovery.all_proposals(task.documents, vocab, d.m, d.max_n, d.unit)
  own = [any(task.matches(t, answers) for t in p)
         for p, answers in zip(proposed, task.doc_answers)] if task.doc_answers else []
  counts = partition_selection.document_counts(proposed, d.m)
  # Per test question, the most documents proposing one term that names its answer (0: none).
  answer_counts = []
  for q in task.test:
    needles = [a.lower() for a in q.answers]
    answer_counts.append(max((c for t, c in counts.items()
                              if any(n in t or t in n for n in needles)
                              and task.matches(t, q.answers)), default=0))
  rows = []
  for eps in epsilons:
    build.privacy.epsilon = float(eps)
    try:
      cal = pipeline.calibration_of(build)
    except ValueError as e:   # the settings do not fit this budget: say so, go on
      rows.append({"epsilon": float(eps), "refused": str(e)})
      continue
    if not cal.terms_m:
      raise ValueError("The config's generation.topic_terms has no 'discovered' source.")
    released = partition_selection.select_partitions(
        pipeline.terms_key(build.seed), counts, cal.sigma_terms, cal.terms_threshold)
    keep = set(released)
    rows.append({
        "epsilon": float(eps), "sigma": cal.sigma_terms, "threshold": cal.terms_threshold,
        "delta_terms": cal.delta_terms, "released": len(released),
        "answer_terms_pct": _share([any(task.matches(t, q.answers) for t in keep)
                                    for q in task.test]),
    })
  return {"dataset": dataset, "seed": build.seed, "documents": len(task.documents), "questions": len(task.test),
          "terms_per_document": d.m, "max_n": d.max_n,
          "rho_terms": float(build.privacy.rho_terms),
          "proposed_own_answer_pct": _share(own) if own else None,
          "answer_proposed_pct": _share([c > 0 for c in answer_counts]),
          "answer_proposals_median": float(np.median(answer_counts)) if answer_counts else 0.0, "distinct_proposals": len(counts),
          "by_epsilon": rows}


def markdown(rep: dict) -> str:
  lines = [f"### Term discovery on {rep['dataset']} ({rep['documents']} documents, "
           f"m {rep['terms_per_document']}, rho {rep['rho_terms']:g})", "",
           f"Documents proposing their own answer: "
           f"{'n/a' if rep['proposed_own_answer_pct'] is None else rep['proposed_own_answer_pct']}"
           " %; "
           f"distinct proposals: {rep['distinct_proposals']}; test answers some document "
           f"proposes: {rep['answer_proposed_pct']} % (median count "
           f"{rep['answer_proposals_median']:g}).", "",
           "| epsilon | threshold | sigma | terms released | test answers released % |",
           "|---|---|---|---|---|"]
  for r in rep["by_epsilon"]:
    if "refused" in r:
      lines.append(f"| {r['epsilon']:g} | does not fit the budget | | | |")
      continue
    lines.append(f"| {r['epsilon']:g} | {r['threshold']:.1f} | {r['sigma']:.2f} | "
                 f"{r['released']} | {r['answer_terms_pct']} |")
  return "\n".join(lines) + "\n"
