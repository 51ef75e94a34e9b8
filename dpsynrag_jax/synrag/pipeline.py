"""DP-SynRAG Algorithm 1 as a resumable job: private documents in, a synthetic database out.

Phases (each timed and logged), in `build_synthetic_db` in this order:
  load       models and the private documents (truncated to the prompt budget)
  keywords   K public-vocabulary words per document                       (private, cached)
  histogram  noisy keyword counts -> top-R keywords                        (released, ledger)
  clusters   soft clusters, each document in at most L                     (private)
  embed      unit embeddings of the documents                              (private, cached)
  rerank     per cluster: noisy embedding sum, threshold -> S_r            (ledger)
  discover   with a 'discovered' topic source: the corpus's terms, by partition selection
                                                                            (released, ledger)
  topics     per cluster, with generation.topic_terms: terms from the lists  (released, ledger)
  decode     per cluster: T private tokens from S_r's clipped logit sum    (released, ledger)
  filter     self-filter of the synthetic texts                            (post-processing)
  release    synthetic_db.jsonl, index.faiss, privacy_ledger.json

Privacy bookkeeping: every mechanism is charged to the ledger, and the ledger saved, BEFORE
anything derived from its output is persisted. Randomness is keyed (`histogram_key`,
`cluster_key`: streams of privacy.keys that no other method draws from), so a resumed run
recomputes exactly what an interrupted one drew and charges nothing twice
(privacy.ResumableLedger records once per release).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from typing import Sequence

from absl import logging
import jax
import ml_collections
import numpy as np
import tqdm

from dpsynrag_jax import distributed
from dpsynrag_jax import host_memory
from dpsynrag_jax import privacy
from dpsynrag_jax.data.private_documents import fit_to_budget, load_private_documents
from dpsynrag_jax.models import dtype_named, load_encoder, load_lm
from dpsynrag_jax.private_decode import PrivatePredictor, decode_many
from dpsynrag_jax.rag import index as rag_index
from dpsynrag_jax.privacy import partition_selection
from dpsynrag_jax.synrag import candidates, clustering, discovery, keywords, reranking
from dpsynrag_jax.synrag import self_filter
from dpsynrag_jax.synrag import build_config
from dpsynrag_jax.synrag import topics
from dpsynrag_jax.synrag import workdir as wd_lib
from dpsynrag_jax.synrag.vocabulary import english_vocabulary


def histogram_key(seed: int) -> jax.Array:
  """The keyword histogram's noise (privacy.keys stream 'histogram')."""
  return privacy.stream_key(seed, "histogram")


def cluster_key(seed: int, cluster: int) -> jax.Array:
  """Cluster r's key (stream 'clusters'): folded with 0 for the re-ranking, 1 for the tokens."""
  return privacy.stream_key(seed, "clusters", cluster)


class PipelineInterrupted(RuntimeError):
  """Raised by runtime.stop_after_clusters (tests: resumption as a real interruption would
  leave it) and runtime.stop_after_rerank (plan a build: its clusters before any decoding)."""


class _Timer:
  """Wall time per phase, logged as each ends and, with log_path, appended there too.

  The log outlives the run: a build cut off and resumed has its earlier runs' phases on disk,
  so a benchmark can report the whole build's time however many runs it took (read_phase_log).
  It stays under private/: decode seconds follow cluster sizes."""

  def __init__(self, log_path: str | None = None):
    self.seconds: dict[str, float] = {}
    self.log_path = log_path
    self._pending: list[dict] = []

  def attach(self, log_path: str) -> None:
    """Logs to `log_path` from now on, with the phases timed before it existed (a build times
    its loading before it writes anything into the work dir)."""
    self.log_path = log_path
    pending, self._pending = self._pending, []
    wd_lib.append_jsonl(log_path, pending)

  @contextlib.contextmanager
  def phase(self, name: str):
    start = time.time()
    logging.info("phase %s ...", name)
    yield
    spent = time.time() - start
    self.seconds[name] = self.seconds.get(name, 0.0) + spent
    self.record(name, spent)
    logging.info("phase %s done in %.1f s", name, self.seconds[name])

  def record(self, name: str, seconds: float, **extra) -> None:
    record = {"phase": name, "seconds": round(seconds, 3), **extra}
    if self.log_path:
      wd_lib.append_jsonl(self.log_path, [record])
    else:
      self._pending.append(record)


def phase_log_name(process: int) -> str:
  """The phase log of one process (process 0 keeps the single-process name)."""
  return "phase_seconds.jsonl" if process == 0 else f"phase_seconds.p{process}.jsonl"


def read_phase_log(workdir: str, process: int = 0) -> dict:
  """Seconds per phase summed over every run of the build in `workdir` (process `process`).

  The decode phase is summed from its per-group records ("decode_group"), written as each
  group of clusters is persisted, so a run cut off mid-decode still counts the groups it
  finished; a finished run's own "decode" record would count them twice and is left out.
  Returns {"runs": runs that logged their load, "seconds": {phase: total}, "peak_rss_gb": the
  largest peak resident size a decode group logged, in GiB (0.0 before any)}."""
  records = wd_lib.read_jsonl(wd_lib.Workdir(workdir).private_path(phase_log_name(process)))
  seconds: dict[str, float] = {}
  for rec in records:
    if rec["phase"] == "decode":
      continue
    name = "decode" if rec["phase"] == "decode_group" else rec["phase"]
    seconds[name] = seconds.get(name, 0.0) + rec["seconds"]
  return {"runs": sum(rec["phase"] == "load" for rec in records), "seconds": seconds,
          "peak_rss_gb": max((rec.get("peak_rss_gb", 0.0) for rec in records), default=0.0)}


def calibration_of(config) -> privacy.Calibration:
  """The noise of a build config (or of a finished build's config.json, options it predates
  read at their off value)."""
  config = build_config.with_options(config)
  p = config.privacy
  groups = topic_groups(config)
  discovers = needs_discovery(config)
  return privacy.calibrate(
      p.epsilon, p.delta, K=config.keywords.K, L=config.clustering.L, T=config.generation.T,
      tau=config.generation.tau, rho_hist=p.rho_hist, eps_theta=p.eps_theta,
      rho_retr=p.rho_retr, accountant=p.accountant,
      svt_paid=config.generation.svt_paid, svt_share=config.generation.svt_share,
      topic_count=topics.total_count(groups), topic_share=p.topic_share,
      terms_m=config.discovery.m if discovers else 0,
      rho_terms=p.rho_terms if discovers else 0.0,
      delta_terms=p.terms_delta_share * p.delta if discovers else 0.0)


def needs_discovery(config) -> bool:
  """Whether the build discovers terms: a 'discovered' topic source or keyword vocabulary."""
  config = build_config.with_options(config)
  return (topics.needs_discovery(topic_groups(config)) or
          config.keywords.vocabulary == "discovered")


def topic_groups(config) -> list[topics.TermGroup]:
  """The config's topic term lists (generation.topic_terms; none in the paper's method)."""
  return topics.parse_spec(build_config.with_options(config).generation.topic_terms)


@dataclasses.dataclass
class _Build:
  """What the phases of one build share: settings, noise, the work dir, the ledger."""
  config: ml_collections.ConfigDict
  cal: privacy.Calibration
  seed: int
  wd: wd_lib.Workdir
  ledger: privacy.ResumableLedger | None   # process 0 only
  process: int
  processes: int

  def cluster_key(self, r: int) -> jax.Array:
    return cluster_key(self.seed, r)


def build_synthetic_db(config: ml_collections.ConfigDict, workdir: str, *, lm=None,
                       encoder=None, documents: Sequence[str] | None = None) -> dict:
  """Runs Algorithm 1 into `workdir`; returns a summary (budget spent, texts, phase seconds).

  lm / encoder: already loaded models to use instead of config.model's (an evaluation that
  answers with the same models loads them once).
  documents: the private documents, handed in instead of loaded from config.data (the
  evaluation's task: the released config then names no local path); a resume must hand in the
  same ones (the work dir's digests check it). Single-process builds only.

  Several processes (dpsynrag_jax.distributed; all see `workdir` on a shared file system):
  process 0 runs every mechanism up to the re-ranking and charges every cluster's tokens; then
  each process decodes the clusters r with r % processes == its index into its own state file;
  process 0 merges them and releases. Draws are keyed by cluster, so the release is the
  single-process one, byte for byte. Other processes return {"process": i, "clusters": n}.
  """
  distributed.maybe_initialize()
  proc, procs = distributed.process_index(), distributed.process_count()
  lead = proc == 0
  wd = wd_lib.Workdir(workdir)
  config = build_config.resolve_in(config, wd)
  if procs > 1 and config.runtime.overwrite:
    raise ValueError("runtime.overwrite is refused with several processes (they would race "
                     "on clearing the work dir); delete the work dir instead.")
  # One build per work dir (process 0 holds the lock for all processes of this build).
  if documents is not None and procs > 1:
    raise ValueError("documents= is for single-process builds; with several processes each "
                     "loads config.data.")
  with (wd_lib.BuildLock(workdir) if lead else contextlib.nullcontext()) as lock:
    return _build(config, wd, lock, proc, procs, lm=lm, encoder=encoder, documents=documents)


def _build(config, wd: wd_lib.Workdir, lock: wd_lib.BuildLock | None, proc: int, procs: int, *,
           lm, encoder, documents) -> dict:
  """build_synthetic_db's phases, under the work dir's lock (`lock`: process 0's, else None).

  Everything that can refuse the command (settings, models, the corpus, the work dir's state)
  runs before the first write into the work dir, so a refused command leaves it as it was."""
  lead = proc == 0
  noise = config.privacy.noise
  if lead:
    wd.check_prepare(config.to_dict(), config.runtime.overwrite)
  cal = calibration_of(config)
  timer = _Timer()
  with timer.phase("load"):
    lm = lm or load_lm(config.model.lm, dtype=dtype_named(config.model.dtype))
    encoder = encoder or load_encoder(config.model.encoder)
    if documents is None:
      documents, where = load_private_documents(config.data)
    else:
      documents = list(documents)
      where = [f"{config.data.name} document {i}" for i in range(len(documents))]
    # The work dir's digests are of the documents as given, before any truncation.
    given = documents
    documents = fit_to_budget(lm, documents, where, config.data.max_doc_tokens,
                              config.data.too_long)
    vocab = english_vocabulary(config.keywords.vocabulary_size)
    # generation.T = 0: each text is its topic opening alone; nothing is decoded.
    predictor = _predictor(config, cal, lm) if cal.T else None
  if lead and not config.runtime.overwrite:
    wd.verify_documents(given)

  secret_path = wd.private_path(wd_lib.NOISE_SEED)
  if lead and wd.prepare(config.to_dict(), config.runtime.overwrite):
    logging.info("Resuming the interrupted run in %s.", wd.root)
  if lead:   # the secret exists before any other process looks for it
    lock.prepared = True
    wd.check_documents(given)
    seed = privacy.noise_seed(noise, config.seed, secret_path, create=True)
  distributed.barrier("prepared")
  if not lead:
    seed = privacy.noise_seed(noise, config.seed, secret_path, create=False)
  timer.attach(wd.private_path(phase_log_name(proc)))
  logging.info("Calibration: sigma_h=%.4g sigma_mu=%.4g eps_theta=%.3g c/tau=%.5g (%s).",
               cal.sigma_h, cal.sigma_mu, cal.eps_theta, cal.c_over_tau, cal.accountant)
  if noise == "seeded":
    logging.warning("privacy.noise='seeded': the noise is drawn from the public seed %d, so "
                    "anyone who knows it can subtract it; this build is a reproducible "
                    "benchmark, not a private release. Use privacy.noise='secret' to release.",
                    config.seed)
  build = _Build(config=config, cal=cal, seed=seed, wd=wd,
                 ledger=privacy.ResumableLedger(wd.private_path("ledger.json"), cal)
                 if lead else None, process=proc, processes=procs)

  if lead:   # every mechanism up to the re-ranking, on process 0
    with timer.phase("discover"):
      proposed, discovered = _discover(build, documents, vocab)
    if config.keywords.vocabulary == "discovered":
      vocab = discovery.vocabulary_of(discovered, vocab)
    with timer.phase("keywords"):
      keyword_ids = _cached_npy(wd.private_path("keywords.npy"),
                                lambda: _keywords(config, documents, vocab, lm, proposed))
    with timer.phase("histogram"):
      top_words = _top_keywords(build, keyword_ids, len(vocab))
    with timer.phase("clusters"):
      top_words, clusters = _clusters(config, keyword_ids, top_words, vocab, encoder)
    with timer.phase("embed"):
      embeddings = _cached_npy(wd.private_path("embeddings.npy"),
                               lambda: encoder.embed(documents))
    with timer.phase("rerank"):
      selected = _select_all(build, clusters, embeddings)
    with timer.phase("topics"):
      leads = _topic_leads(build, documents, selected, proposed, discovered)
    if config.runtime.stop_after_rerank:
      raise PipelineInterrupted("Stopped after the re-ranking (runtime.stop_after_rerank); "
                                "rerun without it to decode.")
    # Every cluster's planned T tokens (whatever EOS does), charged and saved before the first
    # cluster is decoded by any process, in cluster-index order (public).
    decoded = set(wd.generated(0))
    _charge_tokens(build, [r for r in range(len(selected)) if r not in decoded])
    keywords = [vocab.word(int(w)) for w in top_words]   # released with each text
    hints = _public_hints(config, keywords)
    wd_lib.atomic_write_json(wd.private_path(PUBLIC_HINTS), hints)
  distributed.barrier("selected")
  if not lead:
    selected = [members for _, members in sorted(wd.selected().items())]
    hints = wd_lib.read_json(wd.private_path(PUBLIC_HINTS))
    leads = wd_lib.read_json(wd.private_path(TOPIC_LEADS))
  lead_ids = [topics.lead_token_ids(lm, t) for t in leads]

  with timer.phase("decode"):
    mine = [r for r in range(len(selected)) if r % procs == proc]
    generated = (_decode_all(build, predictor, documents, selected, mine, hints, lead_ids,
                             timer) if predictor else _openings_only(build, mine))
  distributed.barrier("decoded")
  if not lead:
    return {"process": proc, "clusters": len(mine)}
  for other in range(1, procs):
    generated.update(wd.generated(other))
  missing = sorted(set(range(len(selected))) - set(generated))
  if missing:
    raise RuntimeError(f"{len(missing)} clusters were not decoded by any process.")

  with timer.phase("filter"):
    texts = [lm.decode(lead_ids[r] + generated[r]).strip() for r in range(len(selected))]
    prompt = self_filter.filter_prompt(config.self_filter.prompt)
    keep = (self_filter.self_filter(lm, texts, prompt) if config.self_filter.enabled
            else np.ones(len(texts), bool))
    keep &= np.array([bool(t) for t in texts], bool)

  with timer.phase("release"):
    records = [{"text": t, "keyword": w} for t, w, k in zip(texts, keywords, keep) if k]
    _release(wd, records, encoder, build.ledger)

  summary = {
      "synthetic_texts": len(records),
      "clusters": len(selected),
      "processes": procs,
      **build.ledger.ledger.summary(),
      "seconds": {k: round(v, 1) for k, v in timer.seconds.items()},
  }
  wd_lib.atomic_write_json(wd.private_path("summary.json"), summary)
  wd.mark_finished()   # last: a build killed before it reruns its release and summary
  logging.info("Released %d synthetic texts; spent epsilon=%.4f (closed form), %.4f (RDP) at "
               "delta=%g.", len(records), summary["eps_closed_form"],
               summary["eps_dp_accounting_rdp"], summary["delta"])
  return summary


def plan_build(config: ml_collections.ConfigDict, workdir: str) -> None:
  """Runs the build of `config` in `workdir` up to its re-ranking (runtime.stop_after_rerank):
  its clusters are chosen, nothing is decoded or released. A planned work dir is resumed, not
  redone. `config` itself is left as it is."""
  config = config.copy_and_resolve_references()
  config.unlock()
  config.runtime.stop_after_rerank = True
  try:
    build_synthetic_db(config, workdir)
  except PipelineInterrupted:
    pass


# ---- the phases' steps, in the order build_synthetic_db runs them ---------------------------

def _devices(count: int):
  devices = jax.local_devices()
  if count < 0 or count > len(devices):
    raise ValueError(f"runtime.devices={count} but {len(devices)} local devices exist "
                     "(0 means all).")
  return devices[:count] if count else devices


def _predictor(config, cal, lm) -> PrivatePredictor:
  """The private decode of config.generation at the calibrated c, on runtime.devices."""
  g = config.generation
  hint = g.public_hint
  if hint not in PUBLIC_HINT_KINDS:
    raise ValueError(f"generation.public_hint must be one of {PUBLIC_HINT_KINDS}, got "
                     f"{hint!r}.")
  predictor = PrivatePredictor(
      lm, c=cal.c, tau=cal.tau, T=cal.T, method=g.clip, alpha=g.alpha, omega=g.omega,
      candidates=g.candidates,
      candidate_ids=candidates.term_token_ids(lm, candidates.public_terms(g.candidate_terms)),
      candidate_width=g.candidate_width, min_length=g.min_length,
      svt=(dict(threshold=g.svt_threshold, epsilon_test=cal.epsilon_test, paid=cal.svt_paid)
           if cal.svt_paid else None),
      devices=_devices(config.runtime.devices))
  if hint and not predictor.selector.needs_public_row:
    raise ValueError("generation.public_hint is read by the public row only, which this "
                     "mechanism does not decode: add omega, candidates, clip='difference' or "
                     "svt_paid, or drop the hint.")
  return predictor


def _cached_npy(path: str, compute):
  if os.path.exists(path):
    return np.load(path)
  value = compute()
  wd_lib.atomic_save_npy(path, value)
  return value


def _keywords(config, documents, vocab, lm, proposed) -> np.ndarray:
  """[N, K] vocabulary ids of each document's keywords (-1 for fewer than K). With
  keywords.vocabulary 'discovered', a document's keywords are its proposed terms that the
  discovery released (at most discovery.m <= K), whatever keywords.method says."""
  if config.keywords.vocabulary == "discovered":
    if config.discovery.m > config.keywords.K:
      raise ValueError(f"keywords.vocabulary='discovered' takes a document's proposals as its "
                       f"keywords: discovery.m ({config.discovery.m}) must be <= keywords.K "
                       f"({config.keywords.K}).")
    return discovery.keyword_ids(proposed, vocab, config.keywords.K)
  if config.keywords.vocabulary != "public":
    raise ValueError(f"keywords.vocabulary must be 'public' or 'discovered', got "
                     f"{config.keywords.vocabulary!r}.")
  if config.keywords.method == "lexical":
    return keywords.lexical_keywords(documents, vocab, config.keywords.K)
  if config.keywords.method == "llm":
    return keywords.llm_keywords(lm, documents, vocab, config.keywords.K)
  raise ValueError(f"keywords.method must be 'lexical' or 'llm', got "
                   f"{config.keywords.method!r}.")


def _top_keywords(build: _Build, keyword_ids, vocab_size: int) -> np.ndarray:
  """The noisy histogram's top-R word ids (charged, then cached in private/)."""
  path = build.wd.private_path("top_words.npy")
  if os.path.exists(path):
    return np.load(path)
  config = build.config
  # A discovered vocabulary may hold fewer words than R (its size is released): R' = its size.
  top_words = clustering.noisy_top_keywords(
      histogram_key(build.seed), keyword_ids, vocab_size, config.keywords.K, build.cal.sigma_h,
      min(config.clustering.R, vocab_size), build.ledger)
  build.ledger.save()
  wd_lib.atomic_save_npy(path, top_words)
  return top_words


def _clusters(config, keyword_ids, top_words, vocab, encoder):
  """(each cluster's leading word id [R'], C_r per cluster): soft clusters over the released
  words, optionally with synonyms merged (post-processing with the public encoder)."""
  threshold = config.clustering.merge_synonyms
  if threshold:
    words = [vocab.word(int(w)) for w in top_words]
    groups = clustering.group_synonyms(words, encoder.embed(words), threshold)
    groups = [[int(top_words[i]) for i in g] for g in groups]
    logging.info("Merged %d keywords into %d clusters (cosine >= %g).", len(top_words),
                 len(groups), threshold)
  else:
    groups = [[int(w)] for w in top_words]
  clusters = clustering.soft_clusters(keyword_ids, top_words, config.clustering.L,
                                      groups=groups)
  return np.asarray([g[0] for g in groups], np.int64), clusters


def _select_all(build: _Build, clusters, embeddings) -> list[np.ndarray]:
  """S_r for every cluster; cached in private/ (document indices are private)."""
  wd, cal, config = build.wd, build.cal, build.config
  done = wd.selected()
  if not config.clustering.rerank:
    # The paper's "w/o re-ranking" ablation: S_r = C_r. No mechanism runs, nothing is charged,
    # and the budget calibrated for re-ranking stays unspent (the ledger shows the smaller total).
    if not done:
      wd.add_selected(dict(enumerate(clusters)))
    return [np.asarray(members, np.int64) for members in clusters]
  for r in tqdm.trange(len(clusters), desc="re-rank", unit="cluster",
                       disable=len(done) == len(clusters)):
    if r in done:
      continue
    members = reranking.select_members(
        jax.random.fold_in(build.cluster_key(r), 0), embeddings, clusters[r],
        sigma_mu=cal.sigma_mu, eps_theta=cal.eps_theta, k=config.clustering.k, cluster=r,
        ledger=build.ledger)
    build.ledger.save()
    wd.add_selected({r: members})
    done[r] = members
  return [done[r] for r in range(len(clusters))]


def _charge_tokens(build: _Build, clusters) -> None:
  """Each cluster's planned tokens: T, or with the sparse vector test its at most svt_paid
  paid tokens and their tests (public maxima, never what a text used)."""
  cal = build.cal
  if not cal.paid_tokens:   # T = 0: openings only, no token is drawn
    return
  for r in sorted(clusters):
    build.ledger.record_tokens(r, cal.paid_tokens, cal.c, cal.tau)
    if cal.svt_paid:
      build.ledger.record_sparse_vector(r, cal.svt_paid, cal.epsilon_test)
  build.ledger.save()


# Each cluster's drawn topic terms as text (its synthetic text's opening), by the lead.
TOPIC_LEADS = "topic_leads.json"


def terms_key(seed: int) -> jax.Array:
  """The term discovery's noise (privacy.keys stream 'terms')."""
  return privacy.stream_key(seed, "terms")


# The terms partition selection released (synrag.discovery), alphabetical.
DISCOVERED_TERMS = "discovered_terms.json"


def _discover(build: _Build, documents, vocab) -> tuple[list[list[str]], list[str]]:
  """(each document's proposed terms, the released terms) with a 'discovered' topic source,
  else ([], []). Charged and saved before the draw; the release is cached in private/ (a
  resumed run reads it back; a run cut off before its write redraws the same set, same key)."""
  if not needs_discovery(build.config):
    return [], []
  d, cal = build.config.discovery, build.cal
  proposed = discovery.all_proposals(documents, vocab, d.m, d.max_n, d.unit)
  path = build.wd.private_path(DISCOVERED_TERMS)
  if os.path.exists(path):
    return proposed, wd_lib.read_json(path)
  build.ledger.record_partition_selection(cal.terms_m, cal.sigma_terms, cal.terms_threshold)
  build.ledger.save()
  released = partition_selection.select_partitions(
      terms_key(build.seed), partition_selection.document_counts(proposed, cal.terms_m),
      cal.sigma_terms, cal.terms_threshold)
  wd_lib.atomic_write_json(path, released)
  logging.info("Term discovery released %d terms (threshold %.1f, sigma %.2f).", len(released),
               cal.terms_threshold, cal.sigma_terms)
  return proposed, released


def _topic_leads(build: _Build, documents, selected, proposed, discovered) -> list[str]:
  """Per cluster, the opening its text starts with: its topic terms (synrag.topics), or ''.
  proposed / discovered: _discover's (the presence of a discovered term is its proposal).

  Every cluster's draw is charged and the ledger saved before any is drawn; the leads are
  saved for the other processes and for a resumed run, which reads them back (a run cut off
  between the ledger's save and the leads' write draws them again: same keys, same terms, and
  the ledger charges each cluster once).
  """
  groups = topics.with_discovered(topic_groups(build.config), discovered)
  path = build.wd.private_path(TOPIC_LEADS)
  if groups and os.path.exists(path):
    leads = wd_lib.read_json(path)
    if len(leads) != len(selected):
      raise wd_lib.WorkdirError(f"{path} holds {len(leads)} topic openings for "
                                f"{len(selected)} clusters; the work dir is inconsistent.")
    return leads
  if not groups:
    leads = [""] * len(selected)
  else:
    cal = build.cal
    for r in range(len(selected)):
      build.ledger.record_topic_terms(r, cal.topic_count, cal.eps_topic)
    build.ledger.save()
    presences = [discovery.presence(proposed, g.terms) if g.source == topics.DISCOVERED
                 else topics.term_presence(documents, g.terms) for g in groups]
    public = english_vocabulary(build.config.keywords.vocabulary_size)   # rarity: public words

    def lead(r: int) -> str:
      drawn = topics.draw_topic(topics.topic_key(build.cluster_key(r)), groups, presences,
                                selected[r], cal.eps_topic)
      return topics.lead_text(topics.ordered(drawn, build.config.generation.lead_order, public))

    leads = [lead(r) for r in tqdm.trange(len(selected), desc="topics", unit="cluster")]
  wd_lib.atomic_write_json(path, leads)
  return leads


# Each cluster's public hint for the public row, written by the lead for every process.
PUBLIC_HINTS = "public_hints.json"
PUBLIC_HINT_KINDS = ("", "keyword")


def _public_hints(config, keywords: list[str]) -> list[str]:
  """Per cluster, the text its public row reads in the document's place.

  generation.public_hint '' (the paper's public row, no document) or 'keyword': the cluster's
  keyword, which the noisy histogram released (it is each synthetic text's "keyword" field),
  so reading it is post-processing: the free and prior tokens can follow the cluster's topic.
  """
  kind = config.generation.public_hint   # checked by _predictor
  return list(keywords) if kind == "keyword" else [""] * len(keywords)


def _decode_all(build: _Build, predictor, documents, selected, clusters,
                hints: list[str], lead_ids: list[list[int]], timer: _Timer
                ) -> dict[int, list[int]]:
  """Token ids of the synthetic texts of `clusters` (this process's share), by groups of equal
  shape over the devices; each group persisted as it finishes, with its seconds in the timer's
  log. hints: per cluster, the public row's hint (_public_hints); lead_ids: per cluster, the
  tokens of its topic terms that every row reads first (_topic_leads), not in the output."""
  wd = build.wd
  done = {r: t for r, t in wd.generated(build.process).items() if r in set(clusters)}
  todo = [r for r in clusters if r not in done]
  suffixes = {r: predictor.suffixes([documents[i] for i in selected[r]]) for r in todo}
  stop_after = build.config.runtime.stop_after_clusters
  already = len(done)

  group_start = time.time()

  def persist(outputs):
    nonlocal group_start
    wd.add_generated(build.process, outputs)
    done.update(outputs)
    now = time.time()
    # Memory beside the time: a build cut off and resumed runs in several processes, and only
    # this log sees the peak of each (bench_build's all_runs reports the largest).
    timer.record("decode_group", now - group_start, clusters=len(outputs),
                 resident_gb=round(host_memory.resident_gb(), 3),
                 peak_rss_gb=round(host_memory.peak_resident_gb(), 3))
    group_start = now
    if 0 <= stop_after <= len(done) - already:
      raise PipelineInterrupted(
          f"Stopped after {len(done)} clusters (runtime.stop_after_clusters).")

  with tqdm.tqdm(total=len(clusters), initial=len(done), desc="private decode",
                 unit="cluster") as bar:
    decode_many(predictor, suffixes, lambda r: jax.random.fold_in(build.cluster_key(r), 1),
                after_group=persist, progress=bar, hint_of=lambda r: hints[r],
                lead_of=lambda r: lead_ids[r])
  return done


def _openings_only(build: _Build, clusters) -> dict[int, list[int]]:
  """T = 0: no token after the opening; recorded like decoded clusters (empty token lists) so
  that a finished build's private side reads the same to the evaluation tools."""
  done = build.wd.generated(build.process)
  outputs = {r: [] for r in clusters if r not in done}
  if outputs:
    build.wd.add_generated(build.process, outputs)
  return {r: [] for r in clusters}


def _release(wd: wd_lib.Workdir, records: list[dict], encoder,
             ledger: privacy.ResumableLedger) -> None:
  """Writes the released files; only texts, their keywords, their embeddings, the ledger."""
  lines = "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n"
                  for r in records)
  wd_lib.atomic_write_text(wd.path(wd_lib.SYNTHETIC_DB), lines)
  vectors = (encoder.embed([r["text"] for r in records]) if records
             else np.zeros((0, encoder.dim), np.float32))
  rag_index.save_index(rag_index.build_index(vectors), wd.path(wd_lib.INDEX))
  wd_lib.atomic_write_text(wd.path(wd_lib.LEDGER), ledger.ledger.to_json())
