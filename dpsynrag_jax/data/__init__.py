"""Datasets as Tasks (Medical Synth from vendored tables, MovieLens and SearchQA from local
copies), and a user's own JSONL/CSV corpus."""

from dpsynrag_jax.data.corpus import Corpus, CorpusError, CorpusReport, load_corpus
from dpsynrag_jax.data.medical_synth import load_medical_synth
from dpsynrag_jax.data.matchers import (answer_contains_any, answer_names_any, contains_any,
                                        title_variants)
from dpsynrag_jax.data.movielens import MovieLensError, load_movielens
from dpsynrag_jax.data.searchqa import SearchQAError, load_searchqa
from dpsynrag_jax.data.tasks import Task, TaskQuery, load_task
