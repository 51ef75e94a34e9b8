"""Methods compared in the evaluation, all behind baselines.base.Method:

  Non-RAG (eps 0), RAG on the private data (eps inf), DP-SynRAG (the synthetic database),
  DP-Synth (Amin et al. 2024), DP-RAG (Grislain 2025, privacy spent per query), Aug-PE
  (Xie et al. 2024).
"""

from dpsynrag_jax.baselines.aug_pe import AugPE
from dpsynrag_jax.baselines.base import Answers, Method, RetrievalMethod, Retriever
from dpsynrag_jax.baselines.dp_rag import DPRAG
from dpsynrag_jax.baselines.dp_synrag import DPSynRAG
from dpsynrag_jax.baselines.dp_synth import DPSynth
from dpsynrag_jax.baselines.non_private import RAG, NonRAG
