"""The privacy ledger: every release of a run, what it cost, and a hard budget.

Every mechanism output that leaves the private side (the noisy histogram, each cluster's
threshold, noisy embedding sum and tokens) is recorded here BEFORE it is released; `record`
raises BudgetExceededError instead of recording when the release would take the run past its
(epsilon, delta) budget.

Composition. Entries without a cluster apply to every document and compose sequentially.
Entries of a cluster apply only to its members; a document sits in at most
`max_clusters_per_document` (L) clusters, so its loss is bounded by the global entries plus the
L most expensive clusters (Theorem 1's "L * per-cluster"). For RDP the top-L is taken order by
order, which is a valid bound for any events and exact for the zCDP events used here. With
max_clusters_per_document=None every cluster is charged sequentially (no parallel composition).

Entries hold public parameters only. Their `params` must match the mechanism's schema exactly,
so no data-dependent number (a cluster size, a count of documents above theta, the number of
tokens decoded before an early EOS) can ride along; record the planned T, not the tokens
actually produced. Labels are free text for humans ("cluster 3"): keep counts out of them too.

Recording is O(1) amortised: per-event RDP curves are cached by parameters, per-cluster and
global totals are running sums, and only the top-L selection touches all clusters.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, Sequence

import dp_accounting
from dp_accounting import rdp as dp_rdp
import numpy as np

from dpsynrag_jax.faults import fault_point
from dpsynrag_jax.privacy import accounting
from dpsynrag_jax.privacy import costs

FORMAT = "dpsynrag_jax.privacy_ledger/1"
# What every ledger states about how its entries were drawn (fixed text: public).
NOTES = [
    "Neighbouring: add or remove one document. Cluster entries compose in parallel, at most "
    "max_clusters_per_document per document; global entries compose sequentially.",
    "Token and threshold draws are Gumbel-max with 64-bit uniforms (noise range 48.15 nats). "
    "Token utilities / tau are floored 40 nats below the top (a public constant that keeps "
    "each entry's sensitivity), so every token keeps a non-zero probability whatever the "
    "data. Threshold intervals more than 48.15 nats below the most likely one cannot be "
    "drawn; their total probability is below (N + 1) e^-48.15, under 1e-16 for up to 10^5 "
    "documents. float32 rounding of the utilities is not accounted, as in any "
    "floating-point implementation.",
]
# Stated in addition when the ledger holds topic-term entries (public: a config choice).
TOPIC_NOTE = (
    "Topic-term draws (kind topic_terms) are Gumbel top-m with the same 64-bit uniforms over "
    "epsilon x the number of the cluster's documents containing each public term, floored 40 "
    "nats below the top; one-shot top-m is the same distribution as m exponential mechanisms "
    "peeled one after the other, each epsilon-bounded-range since the counts are monotone.")
# Stated in addition when the ledger holds a partition selection (term discovery).
DISCOVERY_NOTE = (
    "Term discovery (kind partition_selection) is Gaussian thresholding: each document proposes "
    "at most `count` distinct terms, chosen from that document alone, and counts each once; a "
    "term is released when its document count plus N(0, sigma^2) exceeds `threshold`. Its rho "
    "is that of the Gaussian mechanism of L2 sensitivity sqrt(count); its delta, the chance "
    "that a term only the added document proposes is released, 1 - Phi((threshold - 1) / "
    "sigma)^count, is added to the run's: both accountants convert the total rho at the "
    "budget's delta minus the deltas spent (totals.delta_spent).")
# Calibrated runs land on the budget up to rounding; do not refuse the last token over 1e-9.
_BUDGET_SLACK = 1e-9

class BudgetExceededError(RuntimeError):
  """A release would take the run past its configured (epsilon, delta) budget."""


# kind -> (parameter names, rho(**params), DpEvent(**params)): costs.KINDS, the one source.
_KINDS = costs.KINDS


@dataclasses.dataclass(frozen=True)
class Entry:
  """One release. `cluster` is the public cluster index (rank in the noisy histogram) or None."""
  kind: str
  params: dict
  rho: float
  label: str = ""
  cluster: int | None = None
  delta: float = 0.0   # > 0 for an approximate mechanism (partition selection); global only

  @property
  def key(self) -> tuple:
    """Identifies the event up to its label and cluster (for caching)."""
    return (self.kind, tuple(sorted(self.params.items())))

  def dp_event(self) -> dp_accounting.DpEvent:
    return _KINDS[self.kind][2](**self.params)

  def to_json(self) -> dict:
    out = {"kind": self.kind, "params": dict(self.params), "rho": self.rho,
           "label": self.label, "cluster": self.cluster}
    if self.delta:
      out["delta"] = self.delta
    return out


def make_entry(kind: str, params: dict, *, label: str = "", cluster: int | None = None) -> Entry:
  """Validates public parameters and computes the entry's rho."""
  if kind not in _KINDS:
    raise ValueError(f"Unknown mechanism kind {kind!r}; expected one of {sorted(_KINDS)}.")
  names, rho_fn, _ = _KINDS[kind]
  if set(params) != set(names):
    raise ValueError(f"A {kind!r} entry takes exactly the parameters {names}, got "
                     f"{sorted(params)}; data-dependent extras are not allowed.")
  clean = {}
  for name in names:
    value = params[name]
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
      raise ValueError(f"{kind} parameter {name} must be a number, got {value!r}.")
    if not (math.isfinite(value) and value > 0):
      raise ValueError(f"{kind} parameter {name} must be finite and > 0, got {value!r}.")
    if name == "count":
      if int(value) != value:
        raise ValueError(f"{kind} count must be an integer, got {value!r}.")
      clean[name] = int(value)
    else:
      clean[name] = float(value)
  if not isinstance(label, str):
    raise ValueError(f"label must be a string, got {type(label).__name__}.")
  if cluster is not None:
    if isinstance(cluster, bool) or int(cluster) != cluster or cluster < 0:
      raise ValueError(f"cluster must be a non-negative integer or None, got {cluster!r}.")
    cluster = int(cluster)
  delta = float(costs.delta_of(kind, clean))
  if delta and cluster is not None:
    # A cluster's entries compose in parallel by their rho; a delta would need the same top-L
    # treatment, which no mechanism here needs.
    raise ValueError(f"A {kind!r} entry spends delta and must be global (cluster None).")
  return Entry(kind=kind, params=clean, rho=float(rho_fn(**clean)), label=label, cluster=cluster,
               delta=delta)


class PrivacyLedger:
  """Records releases against an (epsilon, delta) budget under one accountant.

  Args:
    epsilon, delta: the run's budget.
    accountant: 'closed_form' (Theorem 1's zCDP conversion) or 'rdp' (dp_accounting's RDP
      accountant over the recorded events). The budget is enforced under this one; totals are
      available under both.
    max_clusters_per_document: L, or None for no parallel composition across clusters.
    orders: RDP orders.
  """

  def __init__(self, epsilon: float, delta: float, *, accountant: str = "closed_form",
               max_clusters_per_document: int | None = None,
               orders: Sequence[float] = accounting.DEFAULT_ORDERS):
    if not (math.isfinite(epsilon) and epsilon > 0):
      raise ValueError(f"epsilon must be finite and > 0, got {epsilon!r}.")
    if not 0 < delta < 1:
      raise ValueError(f"delta must be in (0, 1), got {delta!r}.")
    if accountant not in accounting.ACCOUNTANTS:
      raise ValueError(f"accountant must be one of {accounting.ACCOUNTANTS}, got {accountant!r}.")
    L = max_clusters_per_document
    if L is not None and (isinstance(L, bool) or int(L) != L or L < 1):
      raise ValueError(f"max_clusters_per_document must be a positive integer or None, got {L!r}.")
    self.epsilon = float(epsilon)
    self.delta = float(delta)
    self.accountant = accountant
    self.max_clusters_per_document = None if L is None else int(L)
    self.orders = np.asarray(orders, np.float64)
    self._entries: list[Entry] = []
    self._rdp_cache: dict[tuple, np.ndarray] = {}
    self._global_rho = 0.0
    self._global_rdp = np.zeros_like(self.orders)
    self._delta_spent = 0.0   # by approximate mechanisms (entries' delta), sequential
    # Per-cluster running totals as rows of growing arrays, so the top-L is one np.partition.
    self._cluster_row: dict[int, int] = {}
    self._cluster_rho = np.zeros((0,))
    self._cluster_rdp = np.zeros((0, len(self.orders)))

  @classmethod
  def for_calibration(cls, calibration: accounting.Calibration) -> "PrivacyLedger":
    """A ledger with a calibration's budget, accountant and L."""
    return cls(calibration.epsilon, calibration.delta, accountant=calibration.accountant,
               max_clusters_per_document=calibration.L)

  # Recording.

  @property
  def entries(self) -> tuple[Entry, ...]:
    return tuple(self._entries)

  def record(self, entry: Entry) -> Entry:
    """Appends `entry`, or raises BudgetExceededError (recording nothing) if it does not fit."""
    # Re-derive rho from the parameters: an Entry built by hand cannot under-report its cost.
    entry = make_entry(entry.kind, entry.params, label=entry.label, cluster=entry.cluster)
    rdp = self._event_rdp(entry)
    global_rho, global_rdp = self._global_rho, self._global_rdp
    cluster_rho, cluster_rdp = self._cluster_rho, self._cluster_rdp
    row = None
    delta_spent = self._delta_spent + entry.delta
    if entry.cluster is None:
      global_rho, global_rdp = global_rho + entry.rho, global_rdp + rdp
    else:
      row = self._cluster_row.get(entry.cluster, len(self._cluster_row))
      if row == len(cluster_rho):
        cluster_rho = np.concatenate([cluster_rho, [0.0]])
        cluster_rdp = np.concatenate([cluster_rdp, np.zeros((1, len(self.orders)))])
      else:
        cluster_rho, cluster_rdp = cluster_rho.copy(), cluster_rdp.copy()
      cluster_rho[row] += entry.rho
      cluster_rdp[row] += rdp
    spent = self._epsilon_of(self.accountant, global_rho, global_rdp, cluster_rho, cluster_rdp,
                             delta_spent)
    if spent > self.epsilon * (1 + _BUDGET_SLACK):
      where = f" ({entry.label})" if entry.label else ""
      raise BudgetExceededError(
          f"Releasing {entry.kind}{where} with rho={entry.rho:.4g} would spend epsilon="
          f"{spent:.6g} > budget {self.epsilon:g} at delta={self.delta:g} "
          f"({self.accountant} accountant); nothing was released.")
    if row is not None:
      self._cluster_row[entry.cluster] = row
    self._entries.append(entry)
    self._delta_spent = delta_spent
    self._global_rho, self._global_rdp = global_rho, global_rdp
    self._cluster_rho, self._cluster_rdp = cluster_rho, cluster_rdp
    return entry

  def record_gaussian(self, sensitivity: float, sigma: float, *, label: str = "",
                      cluster: int | None = None) -> Entry:
    return self.record(make_entry("gaussian", {"sensitivity": sensitivity, "sigma": sigma},
                                  label=label, cluster=cluster))

  def record_histogram(self, K: int, sigma_h: float, *, label: str = "keyword histogram") -> Entry:
    """The noisy keyword histogram (L2 sensitivity sqrt(K)), a global release."""
    return self.record_gaussian(math.sqrt(K), sigma_h, label=label)

  def record_cluster_mean(self, cluster: int, sigma_mu: float, *, label: str = "") -> Entry:
    """A cluster's noisy embedding sum (L2 sensitivity 1)."""
    return self.record_gaussian(1.0, sigma_mu, label=label or f"cluster {cluster} mean",
                                cluster=cluster)

  def record_threshold(self, cluster: int, eps_theta: float, *, label: str = "") -> Entry:
    """A cluster's threshold (eps_theta-DP exponential mechanism)."""
    return self.record(make_entry("exponential", {"epsilon": eps_theta},
                                  label=label or f"cluster {cluster} threshold", cluster=cluster))

  def record_tokens(self, cluster: int | None, T: int, c: float, tau: float, *,
                    label: str = "") -> Entry:
    """T private decoding steps as one entry (record the planned T, before decoding)."""
    default = f"cluster {cluster} tokens" if cluster is not None else "tokens"
    return self.record(make_entry("tokens", {"count": T, "c": c, "tau": tau},
                                  label=label or default, cluster=cluster))

  def record_sparse_vector(self, cluster: int | None, count: int, epsilon: float, *,
                           label: str = "") -> Entry:
    """`count` AboveThreshold instances of parameter epsilon (the free-token tests of one
    text: record the planned maximum of paid tokens, never how many were paid)."""
    default = f"cluster {cluster} token tests" if cluster is not None else "token tests"
    return self.record(make_entry("sparse_vector", {"count": count, "epsilon": epsilon},
                                  label=label or default, cluster=cluster))

  def record_partition_selection(self, count: int, sigma: float, threshold: float, *,
                                 label: str = "discovered terms") -> Entry:
    """Term discovery: partition selection over at most `count` terms a document (global)."""
    return self.record(make_entry("partition_selection",
                                  {"count": count, "sigma": sigma, "threshold": threshold},
                                  label=label))

  def record_topic_terms(self, cluster: int, count: int, epsilon: float, *,
                         label: str = "") -> Entry:
    """A cluster's `count` topic terms, each an epsilon-DP exponential mechanism (the planned
    count of the config, before the draw)."""
    return self.record(make_entry("topic_terms", {"count": count, "epsilon": epsilon},
                                  label=label or f"cluster {cluster} topic terms",
                                  cluster=cluster))

  # Totals.

  def _event_rdp(self, entry: Entry) -> np.ndarray:
    rdp = self._rdp_cache.get(entry.key)
    if rdp is None:
      rdp = accounting.rdp_accountant(entry.dp_event(), self.orders).rdp
      self._rdp_cache[entry.key] = rdp
    return rdp

  def _top(self, values: np.ndarray):
    """Sum over the L largest rows of [clusters, ...] values (all rows when L is None)."""
    L = self.max_clusters_per_document
    if values.shape[0] == 0:
      return np.zeros(values.shape[1:])
    if L is None or L >= values.shape[0]:
      return values.sum(axis=0)
    return -np.sum(np.partition(-values, L - 1, axis=0)[:L], axis=0)

  def _epsilon_of(self, accountant, global_rho, global_rdp, cluster_rho, cluster_rdp,
                  delta_spent) -> float:
    """epsilon at the budget's delta: the zCDP / RDP part is converted at what the approximate
    mechanisms left of it (infinite when they spent it all)."""
    delta = self.delta - delta_spent
    if delta <= 0:
      return math.inf
    if accountant == "closed_form":
      return accounting.zcdp_to_eps(global_rho + float(self._top(cluster_rho)), delta)
    rdp = global_rdp + self._top(cluster_rdp)
    return float(dp_rdp.rdp_privacy_accountant.compute_epsilon(self.orders, rdp, delta)[0])

  @property
  def rho(self) -> float:
    """Total zCDP rho of the worst-case document."""
    return self._global_rho + float(self._top(self._cluster_rho))

  def spent_epsilon(self, accountant: str | None = None) -> float:
    """epsilon spent at the ledger's delta under `accountant` (default: the ledger's)."""
    accountant = accountant or self.accountant
    if accountant not in accounting.ACCOUNTANTS:
      raise ValueError(f"accountant must be one of {accounting.ACCOUNTANTS}, got {accountant!r}.")
    return self._epsilon_of(accountant, self._global_rho, self._global_rdp, self._cluster_rho,
                            self._cluster_rdp, self._delta_spent)

  @property
  def delta_spent(self) -> float:
    """The delta the approximate mechanisms spent (partition selection); the zCDP part is
    converted at delta - delta_spent."""
    return self._delta_spent

  def dp_event(self) -> dp_accounting.DpEvent:
    """The worst-case document's DpEvent: global entries and the L most expensive clusters.

    Identical events are grouped into SelfComposedDpEvents so that a run's 500 clusters do not
    become 1500 nested events. Ranking clusters by rho is exact for the zCDP events recorded
    here (their RDP curves are rho * alpha).
    """
    L = self.max_clusters_per_document
    ranked = sorted(self._cluster_row, key=lambda r: -self._cluster_rho[self._cluster_row[r]])
    charged = set(ranked if L is None else ranked[:L])
    counts: dict[tuple, list] = {}
    for entry in self._entries:
      if entry.cluster is None or entry.cluster in charged:
        counts.setdefault(entry.key, [entry, 0])[1] += 1
    return dp_accounting.ComposedDpEvent([
        e.dp_event() if n == 1 else dp_accounting.SelfComposedDpEvent(e.dp_event(), n)
        for e, n in counts.values()])

  def summary(self) -> dict:
    out = {"epsilon_budget": self.epsilon, "delta": self.delta, "accountant": self.accountant,
           "rho": self.rho, "eps_closed_form": self.spent_epsilon("closed_form"),
           "eps_dp_accounting_rdp": self.spent_epsilon("rdp"), "entries": len(self._entries)}
    if self._delta_spent:
      out["delta_spent"] = self._delta_spent
    return out

  # Serialisation.

  def canonical_entries(self) -> list[Entry]:
    """Entries in an order fixed by public data alone: global entries as recorded, then each
    cluster's entries by cluster index (as recorded within a cluster).

    The recording order may follow the decode schedule, which groups clusters by padded size
    and prompt length (private); the file must not show it.
    """
    return sorted(self._entries, key=lambda e: (e.cluster is not None, e.cluster or 0))

  def to_json(self) -> str:
    return json.dumps({
        "format": FORMAT,
        "notes": NOTES + ([TOPIC_NOTE] if any(e.kind == "topic_terms" for e in self._entries)
                          else []) +
                 ([DISCOVERY_NOTE] if self._delta_spent else []),
        "budget": {"epsilon": self.epsilon, "delta": self.delta},
        "accountant": self.accountant,
        "max_clusters_per_document": self.max_clusters_per_document,
        "totals": self.summary(),  # informative only; recomputed on load
        "entries": [e.to_json() for e in self.canonical_entries()],
    }, indent=1)

  @classmethod
  def from_json(cls, text: str) -> "PrivacyLedger":
    """Rebuilds a ledger by replaying its entries (so a resumed run keeps its budget)."""
    data: dict[str, Any] = json.loads(text)
    if data.get("format") != FORMAT:
      raise ValueError(f"Not a privacy ledger of format {FORMAT!r}: got {data.get('format')!r}.")
    ledger = cls(data["budget"]["epsilon"], data["budget"]["delta"],
                 accountant=data["accountant"],
                 max_clusters_per_document=data["max_clusters_per_document"])
    for i, raw in enumerate(data["entries"]):
      entry = make_entry(raw["kind"], raw["params"], label=raw.get("label", ""),
                         cluster=raw.get("cluster"))
      if not math.isclose(entry.rho, raw["rho"], rel_tol=1e-12, abs_tol=0.0):
        raise ValueError(f"Ledger entry {i} states rho={raw['rho']!r} but its parameters give "
                         f"{entry.rho!r}; the file is corrupt or was edited.")
      if not math.isclose(entry.delta, raw.get("delta", 0.0), rel_tol=1e-12, abs_tol=0.0):
        raise ValueError(f"Ledger entry {i} states delta={raw.get('delta', 0.0)!r} but its "
                         f"parameters give {entry.delta!r}; the file is corrupt or was edited.")
      ledger.record(entry)
    return ledger

  def save(self, path: str) -> None:
    """Writes the JSON atomically (a crash never leaves half a ledger)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
      f.write(self.to_json())
      f.flush()
      os.fsync(f.fileno())
    fault_point(f"write:{os.path.basename(path)}")
    os.replace(tmp, path)

  @classmethod
  def load(cls, path: str) -> "PrivacyLedger":
    with open(path, encoding="utf-8") as f:
      return cls.from_json(f.read())
