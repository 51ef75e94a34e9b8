"""DP-SynRAG on your own documents (docs/your_corpus.md walks through it).

    python -m experiments.build_synthetic_db \
        --config=experiments/configs/your_corpus.py:ARG \
        --config.data.path=runs/my_corpus.jsonl --workdir=runs/my_db

ARG:
  cpu    the paper's Table 6 settings (K 10, R 500, L 5, k 80, T 70, eps 10, delta 1e-3) on
         the embedded SmolLM2-135M and MiniLM, with what the 135M model cannot do replaced:
         lexical keywords (the K rarest public vocabulary words of a document) and no
         self-filter. Hours on a 2-core CPU for thousands of documents.
  paper  the paper's method: keywords extracted by the LM. On a GPU with the paper's models:
         --config.model.lm=llama-3.1-8b-instruct --config.model.encoder=multi-qa-mpnet-base-dot-v1
         --config.model.dtype=bfloat16
  tiny   cpu's pipeline on a 2-layer random model with few, small clusters: seconds; checks
         that a corpus file and the commands work, its texts mean nothing
Every preset reads data.path (JSONL, one {"text": ...} a line, or CSV/TSV with a `text` column;
data.text_field names another field), keeps every document (data.num_documents = 0) and draws
secret noise (privacy.noise = 'secret'), the only mode for a release. The self-filter is off:
its prompts are written for the paper's datasets; with a capable LM, turn it on with a YES/NO
question about your domain (--config.self_filter.enabled=True
--config.self_filter.prompt="Does the following text ...? Answer only YES or NO. Text: {y}
Answer:"). Choose clustering.R for your corpus from a public, rounded size N (about N L / k:
the paper's 500 for 8000 documents); R is released in config.json, so never compute it from
the exact private count.
"""

import ml_collections

from dpsynrag_jax.synrag import build_config
from experiments.configs import medical_synth

APP = "experiments.build_synthetic_db"   # what launch.sweep runs with this config
ARGS = ("cpu", "paper", "tiny")


def get_config(arg: str = "cpu") -> ml_collections.ConfigDict:
  if arg not in ARGS:
    raise ValueError(f"Unknown config arg {arg!r}; expected one of {', '.join(ARGS)}.")
  config = build_config.default_config()
  config.data.name = "corpus"
  config.data.path = ""              # --config.data.path=FILE (.jsonl, .ndjson, .csv, .tsv)
  config.data.num_documents = 0      # every document of the file
  config.privacy.noise = "secret"
  config.self_filter.enabled = False
  if arg in ("cpu", "tiny"):
    config.keywords.method = "lexical"
  if arg == "tiny":   # the tests' tiny model and clusters, as medical_synth.py:tiny sets them
    tiny = medical_synth.get_config("tiny")
    config.model.lm = tiny.model.lm
    config.data.max_doc_tokens = tiny.data.max_doc_tokens
    config.clustering = tiny.clustering
    config.generation.T = tiny.generation.T
  return config
