"""DP-SynRAG as an evaluation method: build the synthetic database once, then plain RAG on it."""

from __future__ import annotations

from typing import Sequence

from dpsynrag_jax.baselines.base import RetrievalMethod, Retriever
from dpsynrag_jax.rag import index as rag_index
from dpsynrag_jax.synrag import pipeline
from dpsynrag_jax.synrag import refresh
from dpsynrag_jax.synrag import workdir as wd_lib


class DPSynRAG(RetrievalMethod):
  """Algorithm 1 (synrag.pipeline) into `workdir`, then retrieval over the released texts only.

  Args:
    config: a pipeline config (experiments/configs/medical_synth.py style).
    workdir: where the build goes; a finished build with the same config is reused, an
      interrupted one resumed. A build of another config there is an error, never overwritten
      (name work dirs by `workdir.config_digest`, as the evaluation apps do).
    top_k: texts retrieved per question.
    documents: the private documents, handed in by the caller (the evaluation's task) instead
      of loaded from config.data: the released config then names no local path (and no corpus
      size the caller did not name). None: the build loads config.data.
  """
  name = "DP-SynRAG"

  def __init__(self, lm, encoder, config, workdir: str, *, top_k: int,
               max_new_tokens: int = 48, documents: Sequence[str] | None = None):
    self.lm, self.encoder, self.config = lm, encoder, config
    self.workdir = workdir
    self.top_k = top_k
    self.max_new_tokens = max_new_tokens
    self.documents = None if documents is None else list(documents)
    self._epsilon = 0.0

  @property
  def noise(self) -> str:
    return self.config.privacy.noise

  def build(self) -> None:
    wd = wd_lib.Workdir(self.workdir)
    if not wd.holds_finished(self.config.to_dict()):
      pipeline.build_synthetic_db(self.config, self.workdir, lm=self.lm,
                                  encoder=self.encoder, documents=self.documents)
    # Only released files are read from here on.
    records = wd_lib.read_jsonl(wd.path(wd_lib.SYNTHETIC_DB))
    index = rag_index.load_index(wd.path(wd_lib.INDEX))
    vectors = index.reconstruct_n(0, index.ntotal) if index.ntotal else None
    self.retriever = Retriever(self.encoder, [r["text"] for r in records], vectors)
    # Max over partitions when documents were appended (parallel composition), else the ledger.
    self._epsilon = refresh.per_document_epsilon(self.workdir)

  @property
  def epsilon(self) -> float:
    return self._epsilon

  @property
  def synthetic_texts(self) -> list[str]:
    return list(self.retriever.texts) if self.retriever is not None else []
