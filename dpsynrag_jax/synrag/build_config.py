"""The build config's schema: every field a DP-SynRAG build reads, defined once.

`default_config()` is the paper's method on Medical Synth (Table 6) with the embedded models;
experiment presets (experiments/configs/medical_synth.py) start from it and change fields.
`resolve(config, recorded)` is what a build runs on: it refuses unknown fields and missing
required ones, and fills the options a config may leave out with their off value. The pipeline
then reads fields directly, never with a default at the read: a default that changes what is
released lives here, where a reader of the schema sees it.

Required, with no default: `privacy.noise`. Its two values release very different things
('secret' is private, 'seeded' is a reproducible benchmark whose noise anyone can redraw), so a
config that does not say which is refused for a new build. A work dir built before the field
existed recorded no value and drew from the public seed; its resume keeps what it recorded.
"""

from __future__ import annotations

import copy

import ml_collections

from dpsynrag_jax.privacy.keys import NOISE_MODES
from dpsynrag_jax.synrag import workdir as wd_lib

# generation.lead_order: how a topic opening orders each group's drawn terms (synrag.topics).
LEAD_ORDERS = ("draw", "rarest")

# Fields a config must set itself for a new build (section, name) -> why, for the error.
REQUIRED = {
    ("privacy", "noise"):
        "'secret' (64 CSPRNG bits kept in the work dir's private/ side: a private release) or "
        "'seeded' (drawn from the public `seed`: a reproducible benchmark, not private)",
}

# Options a config may leave out, with the value that turns each off (the paper's method), and
# runtime knobs that decide how, not what, is built. A config written before an option existed
# builds what it built then.
OPTIONAL = {
    # The options registered with the work dir (builds made before each existed compare equal
    # to configs holding it at this value), but the required noise mode.
    **{field: off for field, off in wd_lib.OPTIONAL_FIELDS.items() if field not in REQUIRED},
    ("runtime", "devices"): 0,
    ("runtime", "overwrite"): False,
    ("runtime", "stop_after_clusters"): -1,
    ("runtime", "stop_after_rerank"): False,
}


class ConfigError(ValueError):
  """A build config the schema refuses (unknown or missing fields)."""


def default_config() -> ml_collections.ConfigDict:
  """The paper's settings (Table 6) on all 8000 Medical Synth notes, LLM keywords and the
  self-filter, on the embedded SmolLM2-135M and MiniLM; secret noise."""
  config = ml_collections.ConfigDict()
  config.seed = 0

  config.data = ml_collections.ConfigDict()
  config.data.name = "medical_synth"      # or "corpus" with data.path
  config.data.path = ""                   # docs.jsonl ({"text": ...} per line) or .csv
  config.data.text_field = "text"
  config.data.num_documents = 8000        # at most this many documents; 0 keeps all
  config.data.split_seed = 0
  config.data.max_doc_tokens = 256        # prompt budget per document
  config.data.too_long = "truncate"       # or "error"

  config.model = ml_collections.ConfigDict()
  config.model.lm = "smollm2-135m-instruct"
  config.model.encoder = "all-minilm-l6-v2"
  config.model.dtype = "float32"

  config.privacy = ml_collections.ConfigDict()
  config.privacy.epsilon = 10.0
  config.privacy.delta = 1e-3
  config.privacy.rho_hist = 0.1
  config.privacy.eps_theta = 0.4
  config.privacy.rho_retr = 0.009
  config.privacy.accountant = "closed_form"   # or "rdp": same (eps, delta), larger c
  # Read only with generation.topic_terms; 1 with generation.T = 0 (openings-only texts).
  config.privacy.topic_share = 0.5
  # Read only with a 'discovered' topic term source (synrag.discovery): the zCDP rho of the
  # partition selection that finds the terms, and the part of delta its threshold spends.
  config.privacy.rho_terms = 0.05
  config.privacy.terms_delta_share = 0.1
  # 'secret': the noise seed is 64 CSPRNG bits kept in the build's private/ side (a release).
  # 'seeded': drawn from the public `seed` (reproducible benchmarks and tests; anyone who knows
  # the seed can subtract the noise, so such a build is not a private release).
  config.privacy.noise = "secret"

  config.keywords = ml_collections.ConfigDict()
  config.keywords.method = "llm"          # or "lexical" (fast, deterministic)
  config.keywords.K = 10
  config.keywords.vocabulary_size = 60000
  # 'public' (the paper: wordfreq's English list) or 'discovered': the terms the discovery
  # released (section discovery), each document's keywords its released proposals.
  config.keywords.vocabulary = "public"

  config.clustering = ml_collections.ConfigDict()
  config.clustering.R = 500
  config.clustering.L = 5
  config.clustering.k = 80
  config.clustering.rerank = True         # False: S_r = C_r (the paper's ablation)
  # > 0: keywords whose public-encoder cosine reaches this share a cluster (synonyms); 0: off.
  config.clustering.merge_synonyms = 0.0

  config.generation = ml_collections.ConfigDict()
  config.generation.T = 70
  config.generation.tau = 1.0
  config.generation.clip = "grislain"     # or "clamp", or "difference" (public + clipped diffs)
  config.generation.alpha = 1.0
  config.generation.omega = 0.0           # public prior weight; 0 is the paper
  # Candidate tokens: > 0 draws each token from the public row's top-n plus the tokens of
  # candidate_terms ('medical_synth' or a file of public terms); 0 is the whole vocabulary.
  config.generation.candidates = 0
  config.generation.candidate_terms = ""
  # Top-k+: also admit every token within this many nats of the public row's n-th logit;
  # min_length: no EOS before this step (a text has at least min_length + 1 tokens unless T is
  # shorter). Both read public data only; 0 is off.
  config.generation.candidate_width = 0.0
  config.generation.min_length = 0
  # The public row's document: '' none (the paper), 'keyword' the cluster's released keyword
  # (post-processing of the histogram), so free and prior tokens follow the cluster's topic.
  config.generation.public_hint = ""
  # Free public tokens: > 0 turns on the sparse vector test, with at most this many paid tokens
  # per text (public); svt_threshold is in documents, svt_share the part of each paid token's
  # budget that goes to its test. 0 is the paper.
  config.generation.svt_paid = 0
  config.generation.svt_threshold = 1.0
  config.generation.svt_share = 0.5
  # Topic terms: each cluster first draws terms from public lists by exponential mechanisms
  # over how many of its documents contain each ('list:count,...', e.g.
  # 'medical_synth.diseases:1,medical_synth.symptoms:3'), and its text starts with them;
  # privacy.topic_share is the part of each cluster's budget left after its threshold and
  # embedding sum that they take. '' is the paper. With T = 0 and topic_share = 1 each text is
  # its terms alone ("Snurfles. Fever, Cough, Sneezing."): nothing is decoded.
  # A source 'discovered' (e.g. 'discovered:4') draws from the terms found in the corpus
  # itself, under DP (section discovery); needed where no public list exists.
  config.generation.topic_terms = ""
  # The order of a group's drawn terms in the opening: 'draw' (most likely first) or 'rarest'
  # (by the public word frequencies, rarest first: a name before the words around it), which a
  # small reader copies the answer from more often. Post-processing of the draw: free.
  config.generation.lead_order = "draw"

  # Term discovery (synrag.discovery): each document proposes its m rarest phrases of at most
  # max_n words; partition selection releases those enough documents propose.
  config.discovery = ml_collections.ConfigDict()
  config.discovery.m = 5
  config.discovery.max_n = 3
  # 'runs': maximal runs of content words; 'clauses': whole clauses (text between punctuation),
  # which keep the corpus's framing of a term ("the diagnosis is ..."); 'names': runs of
  # capitalised words first (people, places, titles), then the runs; max_n words at most.
  config.discovery.unit = "runs"

  config.self_filter = ml_collections.ConfigDict()
  config.self_filter.enabled = True
  config.self_filter.prompt = "medical"   # a key of FILTER_PROMPTS or a template with {y}

  config.runtime = ml_collections.ConfigDict()
  config.runtime.devices = 0              # 0: all local devices
  config.runtime.overwrite = False
  config.runtime.stop_after_clusters = -1  # tests: simulate an interruption
  config.runtime.stop_after_rerank = False  # plan a build: clusters only (evaluation.funnel)
  return config


def _fields(tree: dict, prefix: tuple = ()) -> dict[tuple, object]:
  out = {}
  for name, value in tree.items():
    if isinstance(value, dict):
      out.update(_fields(value, prefix + (name,)))
    else:
      out[prefix + (name,)] = value
  return out


def with_options(config) -> ml_collections.ConfigDict:
  """A copy of `config` with the options it leaves out at their off value (OPTIONAL): what a
  config of a finished build (its config.json, maybe from before an option existed) meant."""
  given = config.to_dict() if isinstance(config, ml_collections.ConfigDict) else config
  given = copy.deepcopy(given)
  for (section, name), off in OPTIONAL.items():
    given.setdefault(section, {}).setdefault(name, off)
  return ml_collections.ConfigDict(given)


def resolve_in(config, wd: "wd_lib.Workdir") -> ml_collections.ConfigDict:
  """resolve() for a build in work dir `wd`: against the build there that this one would
  resume (none with runtime.overwrite, which starts over)."""
  given = config.to_dict() if isinstance(config, ml_collections.ConfigDict) else config
  overwrite = given.get("runtime", {}).get("overwrite", OPTIONAL[("runtime", "overwrite")])
  return resolve(given, None if overwrite else wd.recorded_config())


def resolve(config, recorded: dict | None = None) -> ml_collections.ConfigDict:
  """The config a build runs on (a new ConfigDict; `config` is left as it is).

  Args:
    config: a build config (ConfigDict or dict).
    recorded: the config.json of the interrupted build in the work dir this build resumes, or
      None for a new build. A required field the config leaves out is taken from it (a build
      from before the field existed: its registered old meaning), never invented.

  Raises:
    ConfigError: an unknown field (a typo would otherwise be ignored), a required field missing
      for a new build, or a field of the schema missing that has no off value.
  """
  given = config.to_dict() if isinstance(config, ml_collections.ConfigDict) else config
  given = copy.deepcopy(given)
  schema = _fields(default_config().to_dict())
  have = _fields(given)
  unknown = sorted(".".join(f) for f in have if f not in schema)
  if unknown:
    raise ConfigError(f"Unknown build config field(s) {', '.join(unknown)}; the fields are those "
                      "of dpsynrag_jax.synrag.build_config.default_config().")
  for field, why in REQUIRED.items():
    if field in have:
      continue
    if recorded is None:
      raise ConfigError(f"The build config sets no {'.'.join(field)}; set it to {why}, e.g. "
                        f"--config.{'.'.join(field)}=secret.")
    value = _fields(recorded).get(field, wd_lib.OPTIONAL_FIELDS.get(field))
    given.setdefault(field[0], {})[field[1]] = value
  missing = sorted(".".join(f) for f in schema if f not in have and f not in OPTIONAL
                   and f not in REQUIRED)
  if missing:
    raise ConfigError(f"The build config lacks {', '.join(missing)}; start from "
                      "dpsynrag_jax.synrag.build_config.default_config() (or a preset of "
                      "experiments/configs) and change what differs.")
  for (section, name), off in OPTIONAL.items():
    given.setdefault(section, {}).setdefault(name, off)
  if given["generation"]["lead_order"] not in LEAD_ORDERS:
    raise ConfigError(f"generation.lead_order must be one of {LEAD_ORDERS}, got "
                      f"{given['generation']['lead_order']!r}.")
  if given["privacy"]["noise"] not in NOISE_MODES:
    raise ConfigError(f"privacy.noise must be one of {NOISE_MODES}, got "
                      f"{given['privacy']['noise']!r}.")
  return ml_collections.ConfigDict(given)
