"""A privacy ledger saved after every release and replayed on resume, so that a resumed build
re-derives its keyed draws without paying for them twice."""

from __future__ import annotations

import os

from dpsynrag_jax.privacy import accounting
from dpsynrag_jax.privacy.ledger import PrivacyLedger


class ResumableLedger:
  """A PrivacyLedger saved to `path`, whose releases are recorded once each.

  A resumed run re-runs keyed mechanisms and gets exactly the draws the interrupted run got; it
  must not pay for them twice. A release is identified by (kind, cluster) for a cluster's
  releases (each cluster has one of each kind) and by (kind, name) for a global one, which
  must be named: two global token releases under one default label would otherwise be charged
  once. Callers save() before persisting anything derived from a mechanism's output.
  """

  def __init__(self, path: str, calibration: accounting.Calibration):
    self.path = path
    self.ledger = (PrivacyLedger.load(path) if os.path.exists(path)
                   else PrivacyLedger.for_calibration(calibration))
    self._done = {self._release(e.kind, e.cluster, e.label) for e in self.ledger.entries}

  @staticmethod
  def _release(kind: str, cluster: int | None, name: str) -> tuple:
    return (kind, "cluster", cluster) if cluster is not None else (kind, "global", name)

  def _once(self, kind: str, cluster: int | None, name: str, record) -> None:
    if cluster is None and not name:
      raise ValueError(f"A global {kind} release needs a name that identifies it (resume "
                       "charges each named release once).")
    release = self._release(kind, cluster, name)
    if release not in self._done:
      record()
      self._done.add(release)

  def record_histogram(self, K: int, sigma_h: float) -> None:
    name = "keyword histogram"
    self._once("gaussian", None, name,
               lambda: self.ledger.record_histogram(K, sigma_h, label=name))

  def record_cluster_mean(self, cluster: int, sigma_mu: float) -> None:
    self._once("gaussian", cluster, "",
               lambda: self.ledger.record_cluster_mean(cluster, sigma_mu))

  def record_threshold(self, cluster: int, eps_theta: float) -> None:
    self._once("exponential", cluster, "",
               lambda: self.ledger.record_threshold(cluster, eps_theta))

  def record_tokens(self, cluster: int | None, T: int, c: float, tau: float, *,
                    name: str = "") -> None:
    """A cluster's tokens, or (cluster None) a global token release called `name`."""
    self._once("tokens", cluster, name,
               lambda: self.ledger.record_tokens(cluster, T, c, tau, label=name))

  def record_sparse_vector(self, cluster: int, count: int, epsilon: float) -> None:
    """A cluster's token tests (the sparse vector test of its free public tokens)."""
    self._once("sparse_vector", cluster, "",
               lambda: self.ledger.record_sparse_vector(cluster, count, epsilon))

  def record_partition_selection(self, count: int, sigma: float, threshold: float) -> None:
    """The discovered topic terms (synrag.discovery), one global release."""
    name = "discovered terms"
    self._once("partition_selection", None, name,
               lambda: self.ledger.record_partition_selection(count, sigma, threshold,
                                                               label=name))

  def record_topic_terms(self, cluster: int, count: int, epsilon: float) -> None:
    """A cluster's topic terms (synrag.topics)."""
    self._once("topic_terms", cluster, "",
               lambda: self.ledger.record_topic_terms(cluster, count, epsilon))

  def save(self) -> None:
    self.ledger.save(self.path)
