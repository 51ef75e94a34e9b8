"""Dataset builders: Medical Synth from vendored tables, and a user's own JSONL/CSV corpus."""

from dpsynrag_jax.data.corpus import Corpus, CorpusError, CorpusReport, load_corpus
from dpsynrag_jax.data.medical_synth import MedicalSynth, Query, load_medical_synth
