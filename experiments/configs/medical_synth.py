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
  demo   `make demo`: all 8000 notes, 96 clusters of about 40 notes, each note in one (L = 1),
         settings chosen with the funnel on validation questions (experiments.funnel --plan),
         each text opening with its cluster's topic terms; minutes on a 2-core CPU
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


def get_config(arg: str = "paper") -> ml_collections.ConfigDict:
  if arg not in ("paper", "paper_cpu", "demo", "quick", "tiny"):
    raise ValueError(f"Unknown config arg {arg!r}; expected paper, paper_cpu, demo, quick or "
                     "tiny.")
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
    # Chosen with the funnel's plan mode on 100 validation questions and the decode fidelity
    # of a first build (BUILD_NOTES, "Demo settings"): on all 8000 notes, 96 clusters of ~40
    # nearest notes with L = 1 reach 85 % coverage (a question's disease is the majority of
    # some cluster) with ~2000 decoded rows. L = 1 gives c/tau = 0.25 (T = 64 alone, or
    # T = 32 after topic terms that take half of the rest), so 40 agreeing notes outweigh the
    # vocabulary's noise (k c = 10; the paper's k = 80 and c = 0.106 give 8.5); with k = 30 no
    # cluster under 25 notes named its disease. The quick config's 24 clusters cover 43 %.
    config.keywords.method = "lexical"
    config.clustering.R = 96
    config.clustering.L = 1
    config.clustering.k = 40
    # Topic terms (issue 18): each text opens with its cluster's disease and three symptoms,
    # drawn by exponential mechanisms (eps_topic 1.44 at L = 1), then 32 private tokens at the
    # same c as the earlier 64 without terms (0.254): the disease no longer has to survive
    # the token draws (56 % of pure clusters named it with T = 64 and no terms).
    config.generation.topic_terms = "medical_synth.diseases:1,medical_synth.symptoms:3"
    config.privacy.topic_share = 0.5
    config.generation.T = 32
    config.self_filter.enabled = False   # SmolLM2-135M cannot judge YES/NO (see quick)
    # A demonstration that prints the same figures on every machine (README): its noise comes
    # from the public seed, and the demo says that it is therefore not a private release.
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
