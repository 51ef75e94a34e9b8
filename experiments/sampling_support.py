"""How far below the top the token utilities of real clusters reach, against the Gumbel noise.

    python -m experiments.sampling_support --workdir=runs/paper_cpu/build --clusters=20

For the first `clusters` non-empty clusters of a finished (or partly decoded) build, the
released tokens are fed back (teacher forcing) and every step's utility is recomputed as the
decode computed it: the Grislain clipped sum / tau, and the difference-clipping utility
log p_public + sum clip(log p_i - log p_public, -c, c) at the same c. Per step, the span is
max - min of the utility over the vocabulary: a token that far below the top can be drawn only
if the noise covers the span. float32 Gumbel noise from 23-bit uniforms covers 21.1 nats; the
64-bit noise the mechanisms use covers 48.15; the public floor caps the span at 40.

It reads private state (cluster members, documents), so it prints aggregate figures only and
writes them, as an evaluation artifact (dpsynrag_jax.evaluation_artifacts: labelled, not
differentially private), to WORKDIR/evaluation/sampling_support.json, never next to the release.
"""

from __future__ import annotations

import json

from absl import flags
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from dpsynrag_jax import evaluation_artifacts as artifacts
from dpsynrag_jax import privacy
from dpsynrag_jax.data.private_documents import fit_to_budget, load_private_documents
from dpsynrag_jax.models import dtype_named, load_lm
from dpsynrag_jax.privacy import mechanisms
from dpsynrag_jax.synrag import pipeline
from dpsynrag_jax.synrag import workdir as wd_lib
from dpsynrag_jax.private_decode import PrivatePredictor
from experiments import cli

TOOL = "sampling_support"
READS = "a build's private/ state (cluster members, decoded tokens) and its private documents"
LOW_MODE_RANGE = (-np.log(-np.log1p(-2.0**-24))) - (-np.log(-np.log(np.finfo(np.float32).tiny)))


def define_flags() -> None:
  flags.DEFINE_string("workdir", None, "A build's work dir (its private/ state is read).")
  flags.DEFINE_integer("clusters", 20, "Non-empty clusters to measure, in index order.")
  flags.DEFINE_integer("rows_per_call", 8, "Document rows per forward pass.")
  flags.mark_flag_as_required("workdir")


def cluster_spans(lm, predictor: PrivatePredictor, documents, tokens, rows_per_call: int):
  """[T] spans of the Grislain and the difference utility of one cluster's steps."""
  c, tau = predictor.selector.c, predictor.selector.tau
  prompt = lambda d: predictor.prefix + predictor.suffixes([d])[0]
  public_prompt = prompt("")
  T = len(tokens)

  def step_logits(prompts):
    seqs = [p + tokens[:-1] for p in prompts]
    out = lm.logits(np.asarray([s + [lm.pad_id] * (max(map(len, seqs)) - len(s))
                                for s in seqs], np.int32))
    return [out[i, len(p) - 1:len(p) - 1 + T] for i, p in enumerate(prompts)]   # [T, V] each

  log_softmax = lambda x: np.asarray(jax.nn.log_softmax(jnp.asarray(x), axis=-1))
  public = step_logits([public_prompt])[0]
  log_public = log_softmax(public)
  grislain = np.zeros_like(public)
  difference = np.zeros_like(public)
  for start in range(0, len(documents), rows_per_call):
    for rows in step_logits([prompt(d) for d in documents[start:start + rows_per_call]]):
      grislain += np.asarray(privacy.clip_logits(jnp.asarray(rows), c))
      # clipping.difference_clipped_sum, with the public row of each step as its reference.
      diff = np.nan_to_num(log_softmax(rows) - log_public, nan=-c, posinf=c, neginf=-c)
      difference += np.clip(diff, -c, c)
  utilities = {"grislain": grislain / tau, "difference": (log_public + difference) / tau}
  return {name: u.max(-1) - u.min(-1) for name, u in utilities.items()}


def measure(workdir: str, num_clusters: int, rows_per_call: int = 8) -> dict:
  """The spans of the first `num_clusters` non-empty decoded clusters of the build in
  `workdir`; written to its evaluation/sampling_support.json."""
  artifacts.announce(TOOL, READS)
  wd = wd_lib.Workdir(workdir)
  config = ml_collections.ConfigDict(wd_lib.read_json(wd.path(wd_lib.CONFIG)))
  if pipeline.topic_groups(config):
    raise ValueError("sampling_support reads the paper's prompts; a build with topic terms "
                     "(generation.topic_terms) decoded each row after its topic opening.")
  cal = pipeline.calibration_of(config)
  lm = load_lm(config.model.lm, dtype=dtype_named(config.model.dtype))
  documents, where = load_private_documents(config.data)
  documents = fit_to_budget(lm, documents, where, config.data.max_doc_tokens,
                            config.data.too_long)
  predictor = PrivatePredictor(lm, c=cal.c, tau=cal.tau, T=cal.T)
  members = {r["cluster"]: r["members"]
             for r in wd_lib.read_jsonl(wd.private_path("selected.jsonl"))}
  generated = {r["cluster"]: r["tokens"]
               for r in wd_lib.read_jsonl(wd.private_path("generated.jsonl"))}
  spans = {"grislain": [], "difference": []}
  sizes = []
  for r in sorted(generated):
    if len(sizes) == num_clusters:
      break
    if not members[r] or len(generated[r]) < 2:
      continue
    sizes.append(len(members[r]))
    got = cluster_spans(lm, predictor, [documents[i] for i in members[r]], generated[r],
                        rows_per_call)
    for name in spans:
      spans[name].extend(got[name].tolist())
  if not sizes:
    raise ValueError(f"{workdir} has no decoded non-empty cluster to measure.")
  report = {"clusters": len(sizes), "mean_cluster_size": float(np.mean(sizes)),
            "max_cluster_size": int(max(sizes)), "c_over_tau": cal.c_over_tau,
            "grislain_bound_2_max_size_c": 2 * max(sizes) * cal.c_over_tau,
            "noise_range": {"float32_default": float(LOW_MODE_RANGE),
                            "64_bit": mechanisms.GUMBEL_RANGE,
                            "floor_span": mechanisms.TOKEN_UTILITY_SPAN}}
  for name, values in spans.items():
    v = np.asarray(values)
    report[name] = {"steps": len(v), "max_span": float(v.max()), "median_span": float(np.median(v)),
                    "share_over_float32_default": float(np.mean(v > LOW_MODE_RANGE)),
                    "share_over_floor": float(np.mean(v > mechanisms.TOKEN_UTILITY_SPAN)),
                    "share_over_64_bit": float(np.mean(v > mechanisms.GUMBEL_RANGE))}
  artifacts.write_json(artifacts.evaluation_path(workdir, "sampling_support.json"), report,
                       TOOL, READS)
  return report


def main(argv):
  del argv
  print(json.dumps(measure(flags.FLAGS.workdir, flags.FLAGS.clusters,
                           flags.FLAGS.rows_per_call), indent=1))


if __name__ == "__main__":
  define_flags()
  cli.run(main)
