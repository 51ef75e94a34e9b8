"""DP-SynRAG Algorithm 1 as a resumable job: private documents in, a synthetic database out.

Phases (each timed and logged):
  load       models and the private documents (truncated to the prompt budget)
  keywords   K public-vocabulary words per document                       (private, cached)
  histogram  noisy keyword counts -> top-R keywords                        (released, ledger)
  clusters   soft clusters, each document in at most L                     (private)
  embed      unit embeddings of the documents                              (private, cached)
  rerank     per cluster: noisy embedding sum, threshold -> S_r            (ledger)
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
import hashlib
import json
import os
import time
from typing import Sequence

from absl import logging
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import tqdm

from dpsynrag_jax import distributed
from dpsynrag_jax import privacy
from dpsynrag_jax.models import load_encoder, load_lm
from dpsynrag_jax.rag import index as rag_index
from dpsynrag_jax.synrag import candidates, clustering, keywords, reranking, self_filter
from dpsynrag_jax.synrag import workdir as wd_lib
from dpsynrag_jax.synrag.private_prediction import PrivatePredictor, decode_many
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
  """Wall time per phase, logged as each ends."""

  def __init__(self):
    self.seconds: dict[str, float] = {}

  @contextlib.contextmanager
  def phase(self, name: str):
    start = time.time()
    logging.info("phase %s ...", name)
    yield
    self.seconds[name] = self.seconds.get(name, 0.0) + time.time() - start
    logging.info("phase %s done in %.1f s", name, self.seconds[name])


def _dtype(name: str):
  return {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[name]


def calibration_of(config) -> privacy.Calibration:
  p = config.privacy
  return privacy.calibrate(
      p.epsilon, p.delta, K=config.keywords.K, L=config.clustering.L, T=config.generation.T,
      tau=config.generation.tau, rho_hist=p.rho_hist, eps_theta=p.eps_theta,
      rho_retr=p.rho_retr, accountant=p.accountant)


# ---- data -----------------------------------------------------------------------------------

def load_private_documents(data_config) -> tuple[list[str], list[str]]:
  """(documents, where) with where[i] naming document i for error messages.

  data.name: medical_synth (vendored), movielens / searchqa (a local copy at data.path), or
  corpus (the user's JSONL/CSV at data.path).
  """
  if data_config.name == "corpus":
    from dpsynrag_jax.data import load_corpus  # pylint: disable=g-import-not-at-top
    if not data_config.path:
      raise ValueError("data.name='corpus' needs --config.data.path=docs.jsonl (or .csv).")
    corpus = load_corpus(data_config.path, text_field=data_config.text_field)
    texts = list(corpus.texts)
    where = [f"{data_config.path} line {n}" for n in corpus.line_numbers]
    if data_config.num_documents:
      texts, where = texts[:data_config.num_documents], where[:data_config.num_documents]
    return texts, where
  task_names = {"medical_synth": "medical", "medical": "medical", "movielens": "movielens",
                "searchqa": "searchqa"}
  if data_config.name not in task_names:
    raise ValueError(f"Unknown data.name {data_config.name!r}; expected one of "
                     f"{sorted(task_names) + ['corpus']}.")
  from dpsynrag_jax.data.tasks import load_task  # pylint: disable=g-import-not-at-top
  task = load_task(task_names[data_config.name], path=data_config.path,
                   num_documents=data_config.num_documents or None, num_validation=0,
                   num_test=0, seed=data_config.split_seed)
  return list(task.documents), [f"{data_config.name} document {i}"
                                for i in range(len(task.documents))]


def fit_to_budget(lm, documents: Sequence[str], where: Sequence[str], max_tokens: int,
                  policy: str) -> list[str]:
  """Documents cut to max_tokens tokens ('truncate', counted in the log) or an error naming the
  first document over budget ('error')."""
  if policy not in ("truncate", "error"):
    raise ValueError(f"data.too_long must be 'truncate' or 'error', got {policy!r}.")
  out, truncated = [], 0
  for doc, ids, place in zip(documents, lm.encode(documents), where):
    if len(ids) <= max_tokens:
      out.append(doc)
      continue
    if policy == "error":
      raise ValueError(f"{place} has {len(ids)} tokens, over data.max_doc_tokens={max_tokens}; "
                       "raise the budget or set data.too_long='truncate'.")
    truncated += 1
    out.append(lm.decode(ids[:max_tokens]))
  if truncated:
    # A count about the private corpus: the operator's log only, never a released file.
    logging.info("Truncated %d documents to %d tokens.", truncated, max_tokens)
  return out


# ---- the build ------------------------------------------------------------------------------

def document_digests(documents: Sequence[str]) -> list[str]:
  """sha256 of each document's text (private: they identify documents)."""
  return [hashlib.sha256(doc.encode("utf-8")).hexdigest() for doc in documents]


def documents_digest(documents: Sequence[str]) -> str:
  """sha256 over the documents in order (each length-prefixed, so boundaries count)."""
  digest = hashlib.sha256()
  for doc in documents:
    data = doc.encode("utf-8")
    digest.update(len(data).to_bytes(8, "little"))
    digest.update(data)
  return digest.hexdigest()


DOCUMENT_DIGESTS = "document_digests.txt"   # private/: one sha256 per document, in order


def read_document_digests(wd: wd_lib.Workdir) -> list[str] | None:
  """The per-document digests a build recorded, or None for a build that predates them."""
  path = wd.private_path(DOCUMENT_DIGESTS)
  if not os.path.exists(path):
    return None
  with open(path, encoding="utf-8") as f:
    return f.read().split()


def _check_documents(wd: wd_lib.Workdir, documents: Sequence[str]) -> None:
  """Records the private documents' digests; refuses to resume over other documents.

  Cached keywords, embeddings and cluster members are matched to documents by position: a
  corpus edited between an interruption and its resume would mix two datasets, and a person
  could land in 2L clusters. The per-document digests let a later append (synrag.refresh)
  refuse documents already built. Both are private state (they identify the corpus).
  """
  path = wd.private_path("documents.sha256")
  digest = documents_digest(documents)
  if os.path.exists(path):
    with open(path, encoding="utf-8") as f:
      recorded = f.read().strip()
    if recorded != digest:
      raise wd_lib.WorkdirError(
          f"{wd.root} holds a build of other documents than the ones loaded now (the corpus "
          "changed since it was started); resume with the same documents, or start a new "
          "work dir.")
  else:
    wd_lib.atomic_write_text(path, digest + "\n")
  if read_document_digests(wd) is None:
    wd_lib.atomic_write_text(wd.private_path(DOCUMENT_DIGESTS),
                             "".join(d + "\n" for d in document_digests(documents)))


def _cached_npy(path: str, compute):
  if os.path.exists(path):
    return np.load(path)
  value = compute()
  wd_lib.atomic_save_npy(path, value)
  return value


def build_synthetic_db(config: ml_collections.ConfigDict, workdir: str, *, lm=None,
                       encoder=None) -> dict:
  """Runs Algorithm 1 into `workdir`; returns a summary (budget spent, texts, phase seconds).

  lm / encoder: already loaded models to use instead of config.model's (an evaluation that
  answers with the same models loads them once).

  Several processes (dpsynrag_jax.distributed; all see `workdir` on a shared file system):
  process 0 runs every mechanism up to the re-ranking and charges every cluster's tokens; then
  each process decodes the clusters r with r % processes == its index into its own state file;
  process 0 merges them and releases. Draws are keyed by cluster, so the release is the
  single-process one, byte for byte. Other processes return {"process": i, "clusters": n}.
  """
  distributed.maybe_initialize()
  proc, procs = distributed.process_index(), distributed.process_count()
  lead = proc == 0
  if procs > 1 and config.runtime.overwrite:
    raise ValueError("runtime.overwrite is refused with several processes (they would race "
                     "on clearing the work dir); delete the work dir instead.")
  wd = wd_lib.Workdir(workdir)
  if lead and wd.prepare(config.to_dict(), config.runtime.overwrite):
    logging.info("Resuming the interrupted run in %s.", workdir)
  distributed.barrier("prepared")
  timer = _Timer()
  seed = privacy.check_seed(config.seed)
  cal = calibration_of(config)
  logging.info("Calibration: sigma_h=%.4g sigma_mu=%.4g eps_theta=%.3g c/tau=%.5g (%s).",
               cal.sigma_h, cal.sigma_mu, cal.eps_theta, cal.c_over_tau, cal.accountant)
  ledger = privacy.ResumableLedger(wd.private_path("ledger.json"), cal) if lead else None

  with timer.phase("load"):
    lm = lm or load_lm(config.model.lm, dtype=_dtype(config.model.dtype))
    encoder = encoder or load_encoder(config.model.encoder)
    documents, where = load_private_documents(config.data)
    if lead:
      _check_documents(wd, documents)
    documents = fit_to_budget(lm, documents, where, config.data.max_doc_tokens,
                              config.data.too_long)
    vocab = english_vocabulary(config.keywords.vocabulary_size)

  key_of_cluster = lambda r: cluster_key(seed, r)
  predictor = PrivatePredictor(
      lm, c=cal.c, tau=cal.tau, T=cal.T, method=config.generation.clip,
      alpha=config.generation.alpha, omega=config.generation.omega,
      candidates=config.generation.get("candidates", 0),
      candidate_ids=candidates.term_token_ids(
          lm, candidates.public_terms(config.generation.get("candidate_terms", ""))),
      devices=_devices(config.runtime.devices))
  if lead:
    top_words, selected = _private_phases(config, cal, documents, vocab, lm, encoder, seed,
                                          key_of_cluster, ledger, wd, timer)
    if config.runtime.get("stop_after_rerank", False):
      raise PipelineInterrupted("Stopped after the re-ranking (runtime.stop_after_rerank); "
                                "rerun without it to decode.")
    if procs > 1:
      _charge_all_tokens(cal, selected, ledger, wd)
  distributed.barrier("selected")
  if not lead:
    selected = _read_selected(wd)

  with timer.phase("decode"):
    mine = [r for r in range(len(selected)) if r % procs == proc]
    generated = _decode_all(config, cal, predictor, documents, selected, mine, key_of_cluster,
                            ledger if procs == 1 else None, wd, _generated_file(proc))
  distributed.barrier("decoded")
  if not lead:
    return {"process": proc, "clusters": len(mine)}
  for other in range(1, procs):
    generated.update(_read_generated(wd, _generated_file(other)))
  missing = sorted(set(range(len(selected))) - set(generated))
  if missing:
    raise RuntimeError(f"{len(missing)} clusters were not decoded by any process.")

  with timer.phase("filter"):
    texts = [predictor.text(generated[r]) for r in range(len(selected))]
    prompt = self_filter.FILTER_PROMPTS.get(config.self_filter.prompt,
                                            config.self_filter.prompt)
    keep = (self_filter.self_filter(lm, texts, prompt) if config.self_filter.enabled
            else np.ones(len(texts), bool))
    keep &= np.array([bool(t) for t in texts], bool)

  with timer.phase("release"):
    records = [{"text": t, "keyword": vocab.word(int(w))}
               for t, w, k in zip(texts, top_words, keep) if k]
    _release(wd, records, encoder, ledger)

  summary = {
      "synthetic_texts": len(records),
      "clusters": len(selected),
      "processes": procs,
      **ledger.ledger.summary(),
      "seconds": {k: round(v, 1) for k, v in timer.seconds.items()},
  }
  wd_lib.atomic_write_json(wd.private_path("summary.json"), summary)
  logging.info("Released %d synthetic texts; spent epsilon=%.4f (closed form), %.4f (RDP) at "
               "delta=%g.", len(records), summary["eps_closed_form"],
               summary["eps_dp_accounting_rdp"], summary["delta"])
  return summary


def _private_phases(config, cal, documents, vocab, lm, encoder, seed, cluster_key, ledger,
                    wd, timer) -> tuple[np.ndarray, list[np.ndarray]]:
  """Keywords, histogram, clusters, embeddings and re-ranking: (top words, S_r per cluster)."""
  with timer.phase("keywords"):
    def extract():
      if config.keywords.method == "lexical":
        return keywords.lexical_keywords(documents, vocab, config.keywords.K)
      if config.keywords.method == "llm":
        return keywords.llm_keywords(lm, documents, vocab, config.keywords.K)
      raise ValueError(f"keywords.method must be 'lexical' or 'llm', got "
                       f"{config.keywords.method!r}.")
    keyword_ids = _cached_npy(wd.private_path("keywords.npy"), extract)

  with timer.phase("histogram"):
    top_path = wd.private_path("top_words.npy")
    if os.path.exists(top_path):
      top_words = np.load(top_path)
    else:
      top_words = clustering.noisy_top_keywords(
          histogram_key(seed), keyword_ids, len(vocab),
          config.keywords.K, cal.sigma_h, config.clustering.R, ledger)
      ledger.save()
      wd_lib.atomic_save_npy(top_path, top_words)

  with timer.phase("clusters"):
    threshold = config.clustering.get("merge_synonyms", 0.0)
    if threshold:
      # Post-processing of the released words with the public encoder: no budget.
      groups = clustering.group_synonyms(
          [vocab.word(int(w)) for w in top_words],
          encoder.embed([vocab.word(int(w)) for w in top_words]), threshold)
      groups = [[int(top_words[i]) for i in g] for g in groups]
      logging.info("Merged %d keywords into %d clusters (cosine >= %g).", len(top_words),
                   len(groups), threshold)
    else:
      groups = [[int(w)] for w in top_words]
    clusters = clustering.soft_clusters(keyword_ids, top_words, config.clustering.L,
                                        groups=groups)
    top_words = np.asarray([g[0] for g in groups], np.int64)  # each cluster's leading word

  with timer.phase("embed"):
    embeddings = _cached_npy(wd.private_path("embeddings.npy"),
                             lambda: encoder.embed(documents))

  with timer.phase("rerank"):
    selected = _select_all(config, cal, clusters, embeddings, cluster_key, ledger, wd)
  return top_words, selected


def _devices(count: int):
  devices = jax.local_devices()
  if count < 0 or count > len(devices):
    raise ValueError(f"runtime.devices={count} but {len(devices)} local devices exist "
                     "(0 means all).")
  return devices[:count] if count else devices


def _select_all(config, cal, clusters, embeddings, cluster_key, ledger, wd) -> list[np.ndarray]:
  """S_r for every cluster; cached in private/ (document indices are private)."""
  path = wd.private_path("selected.jsonl")
  done = {rec["cluster"]: np.asarray(rec["members"], np.int64) for rec in wd_lib.read_jsonl(path)}
  if not config.clustering.rerank:
    # The paper's "w/o re-ranking" ablation: S_r = C_r. No mechanism runs, nothing is charged,
    # and the budget calibrated for re-ranking stays unspent (the ledger shows the smaller total).
    if not done:
      wd_lib.append_jsonl(path, [{"cluster": r, "members": np.asarray(m).tolist()}
                                 for r, m in enumerate(clusters)])
    return [np.asarray(members, np.int64) for members in clusters]
  for r in tqdm.trange(len(clusters), desc="re-rank", unit="cluster",
                       disable=len(done) == len(clusters)):
    if r in done:
      continue
    members = reranking.select_members(
        jax.random.fold_in(cluster_key(r), 0), embeddings, clusters[r], sigma_mu=cal.sigma_mu,
        eps_theta=cal.eps_theta, k=config.clustering.k, cluster=r, ledger=ledger)
    ledger.save()
    wd_lib.append_jsonl(path, [{"cluster": r, "members": members.tolist()}])
    done[r] = members
  return [done[r] for r in range(len(clusters))]


def _read_selected(wd: wd_lib.Workdir) -> list[np.ndarray]:
  done = {rec["cluster"]: np.asarray(rec["members"], np.int64)
          for rec in wd_lib.read_jsonl(wd.private_path("selected.jsonl"))}
  return [done[r] for r in range(len(done))]


def _generated_file(process: int) -> str:
  """Process 0 keeps the single-process name, so a resumed run reads it either way."""
  return "generated.jsonl" if process == 0 else f"generated.p{process}.jsonl"


def _read_generated(wd: wd_lib.Workdir, name: str) -> dict[int, list[int]]:
  return {rec["cluster"]: rec["tokens"] for rec in wd_lib.read_jsonl(wd.private_path(name))}


def _charge_tokens(cal, clusters, ledger) -> None:
  """Every cluster's planned T tokens, charged and saved before any of them is decoded, in
  cluster-index order (public), whatever order the decode runs them in."""
  for r in sorted(clusters):
    ledger.record_tokens(r, cal.T, cal.c, cal.tau)
  ledger.save()


def _charge_all_tokens(cal, selected, ledger, wd) -> None:
  """Several processes: every cluster's tokens charged before any process decodes."""
  decoded = set(_read_generated(wd, _generated_file(0)))
  _charge_tokens(cal, [r for r in range(len(selected)) if r not in decoded], ledger)


def _decode_all(config, cal, predictor, documents, selected, clusters, cluster_key, ledger,
                wd, state_file) -> dict[int, list[int]]:
  """Token ids of the synthetic texts of `clusters`, by groups of equal shape over the devices.

  ledger: charged for every cluster before the first is decoded; None when the tokens were
    charged already (several processes).
  """
  path = wd.private_path(state_file)
  done = {r: t for r, t in _read_generated(wd, state_file).items() if r in set(clusters)}
  todo = [r for r in clusters if r not in done]
  suffixes = {r: predictor.suffixes([documents[i] for i in selected[r]]) for r in todo}
  stop_after = config.runtime.stop_after_clusters
  already = len(done)

  if ledger is not None:  # before decoding: the planned T, whatever EOS does
    _charge_tokens(cal, todo, ledger)

  def persist(outputs):
    wd_lib.append_jsonl(path, [{"cluster": r, "tokens": t} for r, t in outputs.items()])
    done.update(outputs)
    if 0 <= stop_after <= len(done) - already:
      raise PipelineInterrupted(
          f"Stopped after {len(done)} clusters (runtime.stop_after_clusters).")

  with tqdm.tqdm(total=len(clusters), initial=len(done), desc="private decode",
                 unit="cluster") as bar:
    decode_many(predictor, suffixes, lambda r: jax.random.fold_in(cluster_key(r), 1),
                after_group=persist, progress=bar)
  return done


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
  wd.mark_finished()
