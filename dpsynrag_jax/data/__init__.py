"""Dataset builders: Medical Synth from vendored tables, and a user's own JSONL/CSV corpus."""

from dpsynrag_jax.data.corpus import Corpus, CorpusError, CorpusReport, load_corpus
from dpsynrag_jax.data.medical_synth import MedicalSynth, Query, load_medical_synth
from dpsynrag_jax.data.movielens import (MovieLens, MovieLensError, MovieQuery, answer_names_any,
                                         load_movielens, title_variants)
from dpsynrag_jax.data.searchqa import (SearchQA, SearchQAError, SearchQAQuery, answer_contains_any,
                                        load_searchqa)
