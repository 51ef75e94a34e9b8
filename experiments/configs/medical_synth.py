"""DP-SynRAG on Medical Synth.

    python -m experiments.build_synthetic_db \
        --config=experiments/configs/medical_synth.py:ARG --workdir=runs/medical

ARG:
  paper  the paper's settings (8000 documents, K=10, R=500, L=5, k=80, T=70, eps=10, LLM
         keywords) on the embedded SmolLM2 and MiniLM; on a GPU swap in the paper's models with
         --config.model.lm=llama-3.1-8b-instruct --config.model.encoder=multi-qa-mpnet-base-dot-v1
         --config.model.dtype=bfloat16
  paper_cpu  the paper's Table 6 settings on all 8000 notes with the embedded models, where
         the 135M model forces it: lexical keywords, no self-filter (BUILD_NOTES, "Deviations");
         hours on a 2-core CPU
  demo   `make demo`: paper_cpu's clustering on all 8000 notes with openings-only texts (each
         text is its cluster's disease and symptoms drawn by exponential mechanisms, no
         private tokens), eps 5 chosen on validation questions; minutes on a 2-core CPU
  discovered  demo's openings-only texts with no public list: the topic terms and the keyword
         vocabulary are clauses found in the notes themselves by DP partition selection
         (docs/design.md, "Discovered topic terms"); eps 5, RDP; minutes on a 2-core CPU
  demo_paper  `make demo-paper`: paper_cpu (private token decode) on a 1000-note subset with
         10 clusters; minutes on a 2-core CPU
  quick  the earlier demo: a 2000-note subset, 24 clusters (evaluate.py:cpu builds it)
  tiny   a 2-layer random model on 200 documents: seconds, for tests
Any field can be overridden on the command line, e.g. --config.privacy.epsilon=3.

Sweeps (get_sweep; python -m launch.sweep --config=experiments/configs/medical_synth.py:tiny
--sweep=NAME --runner=local --workdir=runs/sweeps):
  epsilon        eps in 3, 5, 10, 20 x both accountants
  clusters       (R, k) paired: (100, 40), (300, 80), (500, 120)
  seeds          seeds 0..4
  tokens         T in 32, 64, 96 x K in 5, 10
  models         the paper's three models (accelerators; --config.model.dtype=bfloat16)
"""

import ml_collections

from dpsynrag_jax.synrag import build_config
from launch import grid

APP = "experiments.build_synthetic_db"   # what launch.sweep runs with this config
ARGS = ("paper", "paper_cpu", "demo", "discovered", "demo_paper", "quick", "tiny")


def get_config(arg: str = "paper") -> ml_collections.ConfigDict:
  if arg not in ARGS:
    raise ValueError(f"Unknown config arg {arg!r}; expected one of {', '.join(ARGS)}.")
  # The paper's method (Table 6) with every field of the schema; presets change fields.
  config = build_config.default_config()

  if arg == "paper_cpu":
    # Everything of Table 6 (K 10, R 500, L 5, k 80, T 70, eps 10, delta 1e-3, rho_hist 0.1,
    # eps_theta 0.4, rho_retr 0.009) on the 8000 notes; only what SmolLM2-135M cannot do is
    # replaced: keywords are the K rarest vocabulary words of a note (public Zipf list) and the
    # YES/NO self-filter is off (BUILD_NOTES, "Deviations from the paper").
    config.keywords.method = "lexical"
    config.self_filter.enabled = False
  elif arg == "demo":
    # `make demo`: paper_cpu's clustering (Table 6: K 10, R 500, L 5, k 80) with
    # openings-only texts: each text is its cluster's disease and three symptoms, drawn by
    # exponential mechanisms from the public Medical Synth lists, and no private tokens
    # (T = 0), so the whole budget left after clustering goes to the terms. The best texts
    # measured for the embedded models, and minutes to build instead of hours
    # (docs/deviations.md, "Openings-only texts"); eps chosen on validation questions.
    config.keywords.method = "lexical"
    config.self_filter.enabled = False
    config.generation.topic_terms = "medical_synth.diseases:1,medical_synth.symptoms:3"
    config.generation.T = 0
    config.privacy.topic_share = 1.0
    config.privacy.accountant = "rdp"
    config.privacy.epsilon = 5.0
    # A demonstration that prints the same figures on every machine (README): its noise comes
    # from the public seed, and the demo says that it is therefore not a private release.
    config.privacy.noise = "seeded"
  elif arg == "discovered":
    # No medical_synth.* list is read: each note proposes its 5 rarest clauses (the text
    # between punctuation marks, at most 8 words: "the diagnosis is ...", a symptom, "the
    # treatment should be ..."), partition selection releases those enough notes propose, the
    # clusters are keyed on them (keywords.vocabulary) and each text is 4 of them drawn per
    # cluster. Unit, vocabulary and m chosen on validation questions (docs/deviations.md);
    # generation.lead_order=rarest raises accuracy and lowers context recall (BUILD_NOTES).
    config = get_config("demo")
    config.privacy.noise = "secret"   # builds released as results, not a demonstration
    config.keywords.vocabulary = "discovered"
    config.discovery.unit = "clauses"
    config.discovery.max_n = 8
    config.discovery.m = 5
    config.generation.topic_terms = "discovered:4"
  elif arg == "demo_paper":
    # `make demo-paper`: the paper's own method (paper_cpu: Table 6 settings, T = 70 private
    # tokens per text) on a 1000-note subset with 10 clusters of about 30 notes, so that its
    # decode (about 300 rows x 70 tokens) fits in minutes on a CPU.
    config.data.num_documents = 1000
    config.keywords.method = "lexical"
    config.self_filter.enabled = False
    config.clustering.R = 10
    config.clustering.k = 30
    config.privacy.noise = "seeded"
  elif arg == "quick":
    # Fewer, larger-c tokens: at eps = 10 with ~40-document clusters, L = 2 and T = 64 give
    # c/tau ~ 0.18 per token, enough for a cluster's consensus to beat 49k-token noise (the
    # paper's L = 5, T = 70 gives 0.106, which needs its ~80-document clusters). 2000 notes
    # make each cluster's 40 nearest members purer in one disease; decoding costs the same.
    # T = 64 reaches the diagnosis, which follows a long symptom list in the notes.
    config.data.num_documents = 2000
    config.keywords.method = "lexical"
    config.clustering.R = 24
    config.clustering.L = 2
    config.clustering.k = 40
    config.generation.T = 64
    # SmolLM2-135M cannot judge YES/NO: its log-odds on real notes and on unrelated sentences
    # overlap (BUILD_NOTES.md), so the filter would drop texts at random. On for real models.
    config.self_filter.enabled = False
  elif arg == "tiny":
    config.model.lm = "tiny-random"
    config.data.num_documents = 200
    config.keywords.method = "lexical"
    config.clustering.R = 6
    config.clustering.L = 2
    config.clustering.k = 12
    config.generation.T = 8
    config.data.max_doc_tokens = 96
    config.self_filter.enabled = False  # a random model's YES/NO means nothing
    config.privacy.noise = "seeded"     # tests compare builds draw for draw
  return config


def get_sweep(name: str) -> list[dict]:
  """Override dicts, one per run (keys are dotted paths into get_config's result)."""
  sweeps = {
      "epsilon": lambda: grid.product({"privacy.epsilon": [3.0, 5.0, 10.0, 20.0],
                                       "privacy.accountant": ["closed_form", "rdp"]}),
      "clusters": lambda: grid.zipped({"clustering.R": [100, 300, 500],
                                       "clustering.k": [40, 80, 120]}),
      "seeds": lambda: grid.product({"seed": [0, 1, 2, 3, 4]}),
      "tokens": lambda: grid.product({"generation.T": [32, 64, 96], "keywords.K": [5, 10]}),
      "models": lambda: grid.product({"model.lm": ["phi-4-mini-instruct", "gemma-2-2b-it",
                                                   "llama-3.1-8b-instruct"]}),
  }
  if name not in sweeps:
    raise ValueError(f"Unknown sweep {name!r}; expected one of {sorted(sweeps)}.")
  return sweeps[name]()
