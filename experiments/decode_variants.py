"""Token-mechanism variants on a public sample of a real build's clusters: decode fidelity and
the share of tokens paid, at several budgets, side by side.

    python -m experiments.decode_variants \
        --build_dir=runs/paper_cpu/eval/dp_synrag/<build> --clusters=60 \
        --epsilons=3,5,10 --variants=paper,svt20 \
        --json_out=docs/results/beyond_sample/evaluation/x.json

The clusters S_r of indices 0 .. n-1 are the build's (chosen at the build's own epsilon); each
variant re-calibrates c (and the test's epsilon) for each budget as a whole build at that budget
would, decodes the sample from fresh keys (dpsynrag_jax.benchmarks.sample_key_of: nothing is
re-released) and scores:

  decode fidelity   sampled clusters with purity >= 0.5 whose text names their majority answer
  topic fidelity    of those, the ones whose topic terms (the text's opening) name it
                    (variants with topic terms only)
  tokens paid       private tokens over all tokens of the sample's texts (1 without the test)

With --expected_topic, no decode: for every cluster of the build with purity >= 0.5, the exact
probability that its disease draw names its majority answer (the exponential mechanism's
softmax over its documents' counts), averaged, for each variant with topic terms and each
budget: the topic stage's fidelity without sampling noise, over all clusters in seconds.

Only the decode stage is compared (the histogram and re-ranking are the build's). Aggregates
only; like the funnel this reads private state (cluster members, the documents' answers), so
its report is an evaluation artifact (dpsynrag_jax.evaluation_artifacts): labelled, not
differentially private, and --json_out is refused beside released files.
"""

from __future__ import annotations

import json
import os
import time

from absl import app
from absl import flags

from dpsynrag_jax import benchmarks
from dpsynrag_jax import evaluation_artifacts as artifacts
from dpsynrag_jax.evaluation import funnel
from experiments import cli

FLAGS = flags.FLAGS
TOOL = "decode_variants"
READS = ("a build's private/ state (cluster members) and its private documents and their "
         "answers")

# name -> config overrides of the token mechanism (generation.*), off = the paper's method.
VARIANTS = {
    "paper": {},
    "svt20": {"svt_paid": 20, "svt_threshold": 1.0, "svt_share": 0.5},
    "svt10": {"svt_paid": 10, "svt_threshold": 1.0, "svt_share": 0.5},
    "svt20_prior": {"svt_paid": 20, "svt_threshold": 1.0, "svt_share": 0.5, "omega": 0.1},
    # Top-k+: the public top-10 widened by 2 nats, plus Medical Synth's public
    # disease, symptom and treatment names (1201 SmolLM2 tokens), no EOS before step 20.
    "topk_plus": {"candidates": 10, "candidate_width": 2.0, "candidate_terms": "medical_synth",
                  "min_length": 20},
    "svt20_topk_plus": {"svt_paid": 20, "svt_threshold": 1.0, "svt_share": 0.5,
                        "candidates": 10, "candidate_width": 2.0,
                        "candidate_terms": "medical_synth", "min_length": 20},
    # The public row reads the cluster's released keyword (generation.public_hint).
    "svt20_keyword": {"svt_paid": 20, "svt_threshold": 1.0, "svt_share": 0.5,
                      "min_length": 20, "public_hint": "keyword"},
    "svt20_topk_plus_keyword": {"svt_paid": 20, "svt_threshold": 1.0, "svt_share": 0.5,
                                "candidates": 10, "candidate_width": 2.0,
                                "candidate_terms": "medical_synth", "min_length": 20,
                                "public_hint": "keyword"},
}
# Topic terms: one disease and three symptoms per cluster, drawn by
# exponential mechanisms over how many of S_r's notes name each (synrag.topics), taking
# privacy.topic_share of each cluster's budget after its threshold and embedding sum.
_TOPIC = "medical_synth.diseases:1,medical_synth.symptoms:3"
_TOPK_PLUS = {"candidates": 10, "candidate_width": 2.0, "candidate_terms": "medical_synth",
              "min_length": 20}
VARIANTS.update({
    "topic": {"topic_terms": _TOPIC, "privacy.topic_share": 0.5},
    "topic90": {"topic_terms": _TOPIC, "privacy.topic_share": 0.9},
    "topic_topk_plus": {"topic_terms": _TOPIC, "privacy.topic_share": 0.5, **_TOPK_PLUS},
    "topic90_topk_plus": {"topic_terms": _TOPIC, "privacy.topic_share": 0.9, **_TOPK_PLUS},
    # Fewer tokens after the terms: each of the 30 gets a larger c from the same budget.
    "topic_T30": {"topic_terms": _TOPIC, "privacy.topic_share": 0.5, "T": 30},
    "topic90_T30": {"topic_terms": _TOPIC, "privacy.topic_share": 0.9, "T": 30},
})


def define_flags() -> None:
  flags.DEFINE_string("build_dir", "", "A build whose clusters are chosen (private state).")
  flags.DEFINE_integer("clusters", 60, "Decode clusters 0 .. clusters-1.")
  flags.DEFINE_list("epsilons", ["3", "5", "10"], "Budgets (epsilon at the build's delta).")
  flags.DEFINE_list("variants", ["paper", "svt20"], f"Names of VARIANTS: {sorted(VARIANTS)}.")
  flags.DEFINE_string("json_out", "", "Where to write the report (JSON); a .md table beside. "
                      "An evaluation artifact: refused beside released files (e.g. "
                      "docs/results/NAME/evaluation/x.json).")
  flags.DEFINE_bool("expected_topic", False, "Exact expected disease-draw fidelity over every "
                    "pure cluster of the build, for the variants with topic terms; no decode.")
  flags.DEFINE_integer("openings_recall", 0, "> 0: context recall, on this many test "
                       "questions, of a database of every cluster's topic opening alone, for "
                       "the variants with topic terms (epsilon 0 rows: uniform draws); no "
                       "decode.")


def majorities(task, selected: dict, ids) -> dict[int, str]:
  """Sampled cluster -> its majority answer, for clusters of purity >= funnel.PURE."""
  majority, purity = funnel.cluster_majorities({r: selected[r] for r in ids},
                                               task.document_answers())
  return {r: a for r, a in majority.items() if purity[r] >= funnel.PURE}


def cluster_keywords(build_dir: str, config) -> list[str]:
  """Each cluster's released keyword (the histogram's top-R words, in cluster order)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from dpsynrag_jax.synrag import workdir as wd_lib  # pylint: disable=g-import-not-at-top
  from dpsynrag_jax.synrag.vocabulary import english_vocabulary  # pylint: disable=g-import-not-at-top
  if config.clustering.get("merge_synonyms", 0.0):
    raise app.UsageError("Cluster keywords of a build with merged synonyms are not rebuilt "
                         "here; use a build with clustering.merge_synonyms = 0.")
  vocab = english_vocabulary(config.keywords.vocabulary_size)
  top_words = np.load(wd_lib.Workdir(build_dir).private_path("top_words.npy"))
  return [vocab.word(int(w)) for w in top_words]


def variant_config(config, epsilon: float, overrides: dict):
  """The build's config at another budget with the variant's generation options."""
  out = config.copy_and_resolve_references()
  with out.unlocked():
    out.privacy.epsilon = float(epsilon)
    for name, value in overrides.items():
      section, _, field = name.rpartition(".")
      out[section or "generation"][field] = value
  return out


# The sample's topic draws: a root of their own, so their keys are not derived from the
# sample's token keys (whose step s folds s into sample_key_of(r)).
_TOPIC_SAMPLE_SEED = benchmarks.SAMPLE_KEY_SEED + 1


def _presences(groups, documents, cache: dict) -> list:
  """Each group's [N, V] term presence; cache: term list source -> presence, filled once."""
  from dpsynrag_jax.synrag import topics  # pylint: disable=g-import-not-at-top
  for g in groups:
    if g.source not in cache:
      cache[g.source] = topics.term_presence(documents, g.terms)
  return [cache[g.source] for g in groups]


def topic_leads(vconfig, cal, loaded, presence_cache: dict, ids=None) -> dict[int, str]:
  """Clusters `ids` (default: the sample's) -> their topic terms as text ('' without them),
  drawn from fresh keys. presence_cache: as _presences."""
  import jax  # pylint: disable=g-import-not-at-top
  from dpsynrag_jax.synrag import pipeline  # pylint: disable=g-import-not-at-top
  from dpsynrag_jax.synrag import topics  # pylint: disable=g-import-not-at-top
  ids = loaded.ids if ids is None else ids
  groups = pipeline.topic_groups(vconfig)
  if not groups:
    return {r: "" for r in ids}
  presences = _presences(groups, loaded.documents, presence_cache)
  root = jax.random.PRNGKey(_TOPIC_SAMPLE_SEED)
  return {r: topics.lead_text(topics.draw_topic(
      topics.topic_key(jax.random.fold_in(root, r)), groups, presences, loaded.selected[r],
      cal.eps_topic)) for r in ids}


def run(build_dir: str, num_clusters: int, epsilons, variants) -> dict:
  from dpsynrag_jax import private_decode  # pylint: disable=g-import-not-at-top
  from dpsynrag_jax.data.tasks import load_task  # pylint: disable=g-import-not-at-top
  from dpsynrag_jax.synrag import pipeline  # pylint: disable=g-import-not-at-top
  from dpsynrag_jax.synrag import topics  # pylint: disable=g-import-not-at-top

  unknown = [v for v in variants if v not in VARIANTS]
  if unknown:
    raise app.UsageError(f"Unknown variants {unknown}; expected some of {sorted(VARIANTS)}.")
  loaded = benchmarks.load_sample(build_dir, num_clusters)
  config = loaded.config
  if config.data.name != "medical_synth":
    raise app.UsageError("decode_variants scores Medical Synth builds (answers are diseases).")
  task = load_task("medical", num_documents=config.data.num_documents, num_validation=0,
                   num_test=0, seed=config.data.split_seed)
  funnel.check_documents(build_dir, task)
  pure = majorities(task, loaded.selected, loaded.ids)
  keywords = (cluster_keywords(build_dir, config)
              if any(VARIANTS[v].get("public_hint") for v in variants) else None)
  rows, presence_cache = [], {}
  for name in variants:
    for epsilon in epsilons:
      vconfig = variant_config(config, epsilon, VARIANTS[name])
      cal = pipeline.calibration_of(vconfig)
      predictor = pipeline._predictor(vconfig, cal, loaded.lm)  # pylint: disable=protected-access
      suffixes = {r: predictor.suffixes([loaded.documents[i] for i in loaded.selected[r]])
                  for r in loaded.ids}
      paid = {}
      start = time.perf_counter()
      hint = VARIANTS[name].get("public_hint", "")
      leads = topic_leads(vconfig, cal, loaded, presence_cache)
      lead_ids = {r: topics.lead_token_ids(loaded.lm, t) for r, t in leads.items()}
      tokens = private_decode.decode_many(
          predictor, suffixes, benchmarks.sample_key_of, paid=paid,
          hint_of=(lambda r: keywords[r]) if hint == "keyword" else None,
          lead_of=lambda r: lead_ids[r])
      seconds = time.perf_counter() - start
      texts = {r: predictor.text(lead_ids[r] + t) for r, t in tokens.items()}
      hits = [task.matches(texts[r], [a]) for r, a in sorted(pure.items())]
      topic_hits = [task.matches(leads[r], [a]) for r, a in sorted(pure.items())]
      total = sum(len(t) for t in tokens.values())
      row = {"variant": name, "epsilon": float(epsilon), "c": cal.c,
             "epsilon_topic": cal.eps_topic if cal.topic_count else None,
             "topic_fidelity": (sum(topic_hits) / len(topic_hits)
                                if cal.topic_count and topic_hits else None),
             "epsilon_test": cal.epsilon_test if cal.svt_paid else None,
             "paid_tokens_charged": cal.paid_tokens,
             "epsilon_spent_closed_form": cal.eps_closed_form(),
             "decode_fidelity": sum(hits) / len(hits) if hits else None,
             "pure_clusters": len(hits), "tokens": total,
             "tokens_paid_share": sum(paid.values()) / total if total else None,
             "mean_text_tokens": total / len(tokens), "seconds": seconds}
      print(json.dumps(row), flush=True)
      rows.append(row)
  return {"build": os.path.abspath(build_dir), "clusters": len(loaded.ids),
          "pure_clusters": len(pure), "build_epsilon": float(config.privacy.epsilon),
          "variants": {v: VARIANTS[v] for v in variants}, "rows": rows}


def expected_topic_fidelity(build_dir: str, epsilons, variants) -> dict:
  """For each (variant with topic terms, eps): the mean over the build's clusters of purity
  >= 0.5 of the probability that the first list's draw (the disease) is the cluster's majority
  answer; exact, from the mechanism's softmax (floored like privacy.select_top_terms), over the
  documents as the build read them (fitted to its prompt budget). A majority answer outside
  the list counts as a miss (no draw can name it)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from dpsynrag_jax.data.tasks import load_task  # pylint: disable=g-import-not-at-top
  from dpsynrag_jax.privacy import mechanisms  # pylint: disable=g-import-not-at-top
  from dpsynrag_jax.synrag import pipeline  # pylint: disable=g-import-not-at-top
  from dpsynrag_jax.synrag import topics  # pylint: disable=g-import-not-at-top
  loaded = benchmarks.load_sample(build_dir, 0)
  config = loaded.config
  task = load_task("medical", num_documents=config.data.num_documents, num_validation=0,
                   num_test=0, seed=config.data.split_seed)
  funnel.check_documents(build_dir, task)
  members = loaded.selected
  majority, purity = funnel.cluster_majorities(members, task.document_answers())
  pure = [r for r in majority if purity[r] >= funnel.PURE]
  rows, presence = [], {}
  for name in variants:
    groups = topics.parse_spec(VARIANTS[name].get("topic_terms", ""))
    if not groups:
      continue
    terms = groups[0].terms
    first = _presences(groups[:1], loaded.documents, presence)[0]
    counts = {r: first[np.asarray(members[r], np.int64)].sum(0) for r in pure}
    for epsilon in epsilons:
      cal = pipeline.calibration_of(variant_config(config, epsilon, VARIANTS[name]))
      hit = []
      for r in pure:
        u = cal.eps_topic * counts[r].astype(np.float64)
        u = np.maximum(u, u.max() - mechanisms.TOKEN_UTILITY_SPAN)
        hit.append(float(np.exp(u[terms.index(majority[r])] - np.logaddexp.reduce(u)))
                   if majority[r] in terms else 0.0)
      rows.append({"variant": name, "epsilon": float(epsilon), "epsilon_topic": cal.eps_topic,
                   "c": cal.c, "expected_topic_fidelity": float(np.mean(hit)) if hit else None})
      print(json.dumps(rows[-1]), flush=True)
  return {"build": os.path.abspath(build_dir), "pure_clusters": len(pure),
          "clusters": len(members), "rows": rows}


def openings_recall(build_dir: str, epsilons, variants, num_test: int) -> dict:
  """For each (variant with topic terms, eps): one opening per cluster of the build (every
  cluster, drawn from fresh keys over its S_r), and the context recall of a database holding
  those openings alone, on the first num_test test questions. What the topic stage alone
  retrieves at that budget; a whole build at that eps draws its own clusters (with the same
  noise scales) and decodes tokens after each opening. The chance row: as many openings of the
  same form drawn uniformly."""
  from dpsynrag_jax.data.tasks import load_task  # pylint: disable=g-import-not-at-top
  from dpsynrag_jax.models import load_encoder  # pylint: disable=g-import-not-at-top
  from dpsynrag_jax.synrag import pipeline  # pylint: disable=g-import-not-at-top
  from dpsynrag_jax.synrag import topics  # pylint: disable=g-import-not-at-top
  loaded = benchmarks.load_sample(build_dir, 0)
  config = loaded.config
  task = load_task("medical", num_documents=config.data.num_documents, num_validation=0,
                   num_test=num_test, seed=config.data.split_seed)
  funnel.check_documents(build_dir, task)
  encoder = load_encoder(config.model.encoder)
  clusters = sorted(loaded.selected)
  rows, presence = [], {}
  for name in variants:
    groups = topics.parse_spec(VARIANTS[name].get("topic_terms", ""))
    if not groups:
      continue
    for epsilon in epsilons:
      vconfig = variant_config(config, epsilon, VARIANTS[name])
      cal = pipeline.calibration_of(vconfig)
      leads = topic_leads(vconfig, cal, loaded, presence, clusters)
      rows.append({"variant": name, "epsilon": float(epsilon), "epsilon_topic": cal.eps_topic,
                   "openings_recall": funnel.recall_of_texts([leads[r] for r in clusters],
                                                             task, encoder)})
      print(json.dumps(rows[-1]), flush=True)
    chance = topics.uniform_leads(groups, len(clusters))
    rows.append({"variant": name, "epsilon": 0.0, "epsilon_topic": 0.0,
                 "openings_recall": funnel.recall_of_texts(chance, task, encoder)})
    print(json.dumps(rows[-1]), flush=True)
  return {"build": os.path.abspath(build_dir), "clusters": len(clusters),
          "questions": len(task.test), "rows": rows}


def markdown(report: dict) -> str:
  lines = [f"Sample: clusters 0-{report['clusters'] - 1} of the build "
           f"(S_r chosen at eps {report['build_epsilon']:g}), {report['pure_clusters']} "
           "with purity >= 0.5.", "",
           "| variant | eps | c | eps_test | eps_topic | topic fidelity | decode fidelity | "
           "tokens paid | mean tokens | s |",
           "|---|---|---|---|---|---|---|---|---|---|"]
  percent = lambda v: "-" if v is None else f"{100 * v:.1f} %"
  for r in report["rows"]:
    test = f"{r['epsilon_test']:.4f}" if r["epsilon_test"] else "-"
    topic = f"{r['epsilon_topic']:.4f}" if r.get("epsilon_topic") else "-"
    lines.append(f"| {r['variant']} | {r['epsilon']:g} | {r['c']:.4f} | {test} | {topic} | "
                 f"{percent(r.get('topic_fidelity'))} | {percent(r['decode_fidelity'])} | "
                 f"{100 * r['tokens_paid_share']:.1f} % | {r['mean_text_tokens']:.1f} | "
                 f"{r['seconds']:.0f} |")
  return "\n".join(lines) + "\n"


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if not FLAGS.build_dir:
    raise app.UsageError("Give --build_dir.")
  artifacts.announce(TOOL, READS)
  if FLAGS.json_out:
    artifacts.check_destination(FLAGS.json_out)   # before the decodes
  epsilons = [float(e) for e in FLAGS.epsilons]
  if FLAGS.expected_topic:
    report, table = expected_topic_fidelity(FLAGS.build_dir, epsilons, FLAGS.variants), None
  elif FLAGS.openings_recall:
    report, table = openings_recall(FLAGS.build_dir, epsilons, FLAGS.variants,
                                    FLAGS.openings_recall), None
  else:
    report = run(FLAGS.build_dir, FLAGS.clusters, epsilons, FLAGS.variants)
    table = markdown(report)
  if FLAGS.json_out:
    artifacts.write_json(FLAGS.json_out, report, TOOL, READS)
    if table:
      artifacts.write_text(os.path.splitext(FLAGS.json_out)[0] + ".md", table, TOOL, READS)
  if table:
    print(table)


if __name__ == "__main__":
  define_flags()
  cli.run(main)
