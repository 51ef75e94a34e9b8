"""Topic terms: a cluster's subject chosen once, privately, from public term lists; the private
decode then writes around it (beyond the paper; off by default).

Why: a disease name is 3-5 tokens that the token mechanism must each draw right, at the one
position where a cluster's notes agree, and at eps <= 5 it does not (BUILD_NOTES, "Beyond the
paper"). Choosing the name as one exponential mechanism over a public list costs one selection
instead of those draws.

  spec      "medical_synth.diseases:1,medical_synth.symptoms:3": term lists, and how many terms
            each cluster draws from each (generation.topic_terms)
  presence  [N, V] bool: document i contains term j (case-insensitive, whole words), computed
            from each document alone
  counts    per cluster, presence[S_r].sum(0): the number of S_r's documents containing each
            term; adding or removing a document moves every count by 0 or 1 in the same
            direction (given the cluster's threshold and noisy mean, outputs of mechanisms
            charged before, S_r changes by that document at most), so each draw is an
            eps_topic-bounded-range exponential mechanism (privacy.select_top_terms)
  lead      the drawn terms as text, "Disease. Symptom a, symptom b, symptom c.": the start of
            the cluster's synthetic text, appended to every row's prompt (documents and public
            row alike) so that the private tokens continue it. Post-processing of the draw.

An empty cluster draws too (all counts 0: uniform), so neither the ledger nor the release says
which clusters are empty. The terms' order within a group is the draw's (most likely first), or
with generation.lead_order 'rarest' the public rarity's (a disease's name before its symptoms).
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Sequence

import jax
import numpy as np

from dpsynrag_jax import privacy
from dpsynrag_jax.synrag import discovery
from dpsynrag_jax.synrag.build_config import LEAD_ORDERS
from dpsynrag_jax.synrag.vocabulary import PublicVocabulary


@dataclasses.dataclass(frozen=True)
class TermGroup:
  """One public term list and how many of its terms each cluster draws."""
  source: str
  terms: tuple[str, ...]
  count: int


def term_list(source: str) -> list[str]:
  """Terms of `source`: 'medical_synth.<diseases|symptoms|treatments>', 'movielens.catalogue='
  and a MovieLens folder (every film title of its movie file), or a text file with one term per
  line. Public: fixed before any document is read."""
  if source.startswith("medical_synth."):
    from dpsynrag_jax.data import medical_synth  # pylint: disable=g-import-not-at-top
    groups = medical_synth.public_term_groups()
    name = source.split(".", 1)[1]
    if name not in groups:
      raise ValueError(f"Unknown Medical Synth term list {source!r}; expected one of "
                       f"{['medical_synth.' + g for g in groups]}.")
    return groups[name]
  if source.startswith("movielens.catalogue="):
    from dpsynrag_jax.data import movielens  # pylint: disable=g-import-not-at-top
    return movielens.catalogue_titles(source.split("=", 1)[1])
  if os.path.isfile(source):
    with open(source, encoding="utf-8") as f:
      terms = [line.strip() for line in f if line.strip()]
    return list(dict.fromkeys(terms))
  raise ValueError(f"Topic term list {source!r} is neither 'medical_synth.<list>' nor a file.")


# The source of the terms found in the private corpus by partition selection (synrag.discovery):
# its list exists only once a build has released it (`with_discovered`).
DISCOVERED = "discovered"


def parse_spec(spec: str) -> list[TermGroup]:
  """'source:count,source:count' -> its groups ('' -> none). Raises ValueError when a count
  is not a positive integer or exceeds its list. A 'discovered' group has no terms yet."""
  groups = []
  for part in [p.strip() for p in spec.split(",") if p.strip()]:
    source, sep, count = part.rpartition(":")
    if not sep or not source or not count.isdigit() or int(count) < 1:
      raise ValueError(f"generation.topic_terms takes 'list:count,...' with counts >= 1, got "
                       f"{part!r} in {spec!r}.")
    if source == DISCOVERED:
      groups.append(TermGroup(source, (), int(count)))
      continue
    terms = tuple(term_list(source))
    if int(count) > len(terms):
      raise ValueError(f"{source} holds {len(terms)} terms; cannot draw {count}.")
    groups.append(TermGroup(source, terms, int(count)))
  return groups


def needs_discovery(groups: Sequence[TermGroup]) -> bool:
  return any(g.source == DISCOVERED for g in groups)


def with_discovered(groups: Sequence[TermGroup], discovered: Sequence[str]) -> list[TermGroup]:
  """The groups with the discovered terms filled in. A group draws at most as many terms as
  were released (the release's size is public; the ledger charged the planned count)."""
  return [dataclasses.replace(g, terms=tuple(discovered), count=min(g.count, len(discovered)))
          if g.source == DISCOVERED else g for g in groups]


def total_count(groups: Sequence[TermGroup]) -> int:
  """Terms drawn per cluster (the count the ledger charges)."""
  return sum(g.count for g in groups)


def term_presence(documents: Sequence[str], terms: Sequence[str]) -> np.ndarray:
  """[N, V] bool: document i contains term j as whole words, ignoring case."""
  # Not inside a longer word on either side; lookarounds rather than \b so that a term that
  # starts or ends with punctuation ("Fargo (1996)") matches too.
  patterns = [(j, t.lower(), re.compile(r"(?<!\w)" + re.escape(t.lower()) + r"(?!\w)"))
              for j, t in enumerate(terms)]
  out = np.zeros((len(documents), len(terms)), bool)
  for i, doc in enumerate(documents):
    lowered = doc.lower()
    for j, plain, pattern in patterns:
      # Each term on its own (overlapping terms, "fever" inside "vague fever", both count);
      # the substring test first is only a cheap filter.
      if plain in lowered and pattern.search(lowered):
        out[i, j] = True
  return out


def topic_key(cluster_key: jax.Array) -> jax.Array:
  """The topic draws' key of a cluster (its cluster key folded with 2; privacy.keys)."""
  return jax.random.fold_in(cluster_key, 2)


def draw_topic(key: jax.Array, groups: Sequence[TermGroup], presences: Sequence[np.ndarray],
               members: np.ndarray, epsilon: float) -> list[list[str]]:
  """Per group, the terms drawn for one cluster. presences[g]: [N, V_g] of group g; members:
  S_r's document indices (possibly none). Charge the ledger before calling."""
  out = []
  for g, (group, presence) in enumerate(zip(groups, presences)):
    if not group.count:   # nothing was discovered
      out.append([])
      continue
    counts = presence[np.asarray(members, np.int64)].sum(axis=0).astype(np.float32)
    picks = privacy.select_top_terms(jax.random.fold_in(key, g), counts, float(epsilon),
                                     group.count)
    out.append([group.terms[int(j)] for j in np.asarray(picks)])
  return out


def uniform_leads(groups: Sequence[TermGroup], n: int, seed: int = 0) -> list[str]:
  """n openings of the form `groups` draws, each list's terms uniform (a control: what random
  names of that form give; seeded, public)."""
  rng = np.random.default_rng(seed)
  return [lead_text([list(rng.choice(g.terms, size=g.count, replace=False)) for g in groups])
          for _ in range(n)]


def lead_token_ids(lm, lead: str) -> list[int]:
  """The token ids every row reads for an opening (none for '')."""
  return lm.encode([lead])[0] if lead else []


def ordered(topic: Sequence[Sequence[str]], order: str, vocab: PublicVocabulary
            ) -> list[list[str]]:
  """The drawn terms of each group in the opening's order (generation.lead_order): 'draw'
  (most likely first) or 'rarest' (by discovery.rarity under the public `vocab`, rarest first,
  ties in draw order). Reads only the draw and public frequencies: post-processing."""
  if order not in LEAD_ORDERS:
    raise ValueError(f"generation.lead_order must be one of {LEAD_ORDERS}, got {order!r}.")
  if order == "draw":
    return [list(terms) for terms in topic]
  return [sorted(terms, key=lambda t: discovery.rarity(t, vocab)) for terms in topic]


def lead_text(topic: Sequence[Sequence[str]]) -> str:
  """The drawn terms as the opening of a synthetic text: groups as sentences, terms of a
  group separated by commas ([['Snurfles'], ['Fever', 'Cough']] -> 'Snurfles. Fever, Cough.')."""
  return " ".join(", ".join(terms) + "." for terms in topic if terms)
