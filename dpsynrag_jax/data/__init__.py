"""Dataset builders: Medical Synth from vendored tables, and a user's own JSONL/CSV corpus."""

from dpsynrag_jax.data.corpus import Corpus, CorpusError, CorpusReport, load_corpus
from dpsynrag_jax.data.medical_synth import MedicalSynth, Query, load_medical_synth
from dpsynrag_jax.data.matchers import (answer_contains_any, answer_names_any, contains_any,
                                        title_variants)
from dpsynrag_jax.data.movielens import MovieLens, MovieLensError, MovieQuery, load_movielens
from dpsynrag_jax.data.searchqa import SearchQA, SearchQAError, SearchQAQuery, load_searchqa
