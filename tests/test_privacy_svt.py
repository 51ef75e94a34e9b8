"""Free public tokens: the sparse vector test of SparseVectorSelector, its accounting and its
place in the decode loop.

The one-step audit is exact: for a fixed cluster the probability of every outcome of a step
(the public token below the test, a private token above it) is computed in closed form from the
Laplace noises and the exponential mechanism, for many random neighbour pairs, and compared with
the claim eps_test + 2c/tau. A sampled check ties the implementation to that closed form.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import integrate
from scipy import stats

from dpsynrag_jax import privacy
from dpsynrag_jax.models import load_lm
from dpsynrag_jax.private_decode import PrivatePredictor
from dpsynrag_jax.privacy import accounting

C, TAU, EPS_TEST, THRESHOLD = 0.25, 0.5, 0.8, 1.0
B, V = 8, 8
CLAIMED = EPS_TEST + privacy.token_epsilon(C, TAU)


def selector(threshold=THRESHOLD, paid=4, method="grislain"):
  base = privacy.PrivateTokenSelector(c=C, tau=TAU, method=method, public_row=True)
  return privacy.SparseVectorSelector(base=base, threshold=threshold, epsilon_test=EPS_TEST,
                                      paid=paid)


def cluster(rng, size):
  """[B, V] logits, rows 0 .. size-1 documents, row B-1 the public row, the rest padding."""
  logits = rng.normal(0, 4, (B, V)).astype(np.float32)
  logits[size:B - 1] = np.nan
  doc_mask = np.arange(B) < size
  public_mask = np.arange(B) == B - 1
  return logits, doc_mask, public_mask


def make_extreme(logits, token):
  """Document 0 puts all its mass on `token` (-inf elsewhere)."""
  logits[0] = -np.inf
  logits[0, token] = 30.0


def without_first(doc_mask):
  """The neighbour without document 0."""
  return doc_mask & (np.arange(B) > 0)


@functools.partial(jax.jit, static_argnums=0)
def step_parts(sel, logits, doc_mask, public_mask):
  """(gap, public token, log-probabilities of the private token) of one step."""
  utility, vocab_mask, public = sel.base.utility(logits, (doc_mask, public_mask))
  gap, token = sel.gap(utility, vocab_mask, public)
  log_p = jax.nn.log_softmax(privacy.mechanisms.floor_utilities(utility / TAU))
  return gap, token, log_p


def laplace_difference_sf(x, eps):
  """P(Lap(4/eps) - Lap(2/eps) >= x), by quadrature over the threshold noise."""
  query, thresh = stats.laplace(scale=4 / eps), stats.laplace(scale=2 / eps)
  value, _ = integrate.quad(lambda z: thresh.pdf(z) * query.sf(x + z), -np.inf, np.inf,
                            epsabs=1e-13, epsrel=1e-11, limit=200)
  return value


def outcome_log_probs(gap, public_token, log_p):
  """log P(step emits token t), t = 0 .. V-1, for a first step of a fresh instance."""
  above = laplace_difference_sf(THRESHOLD - float(gap), EPS_TEST)
  probs = above * np.exp(np.asarray(log_p, np.float64))
  probs[int(public_token)] += 1 - above
  return np.log(probs)


def test_gap_has_sensitivity_one_document():
  rng = np.random.default_rng(0)
  sel = selector()
  worst = 0.0
  for _ in range(300):
    size = int(rng.integers(1, B - 1))
    logits, with_doc, public = cluster(rng, size)
    if rng.random() < 0.3:   # an extreme document
      make_extreme(logits, rng.integers(V))
    without = without_first(with_doc)
    g1 = float(step_parts(sel, logits, with_doc, public)[0])
    g0 = float(step_parts(sel, logits, without, public)[0])
    worst = max(worst, abs(g1 - g0))
  assert worst <= 1 + 1e-5
  assert worst >= 0.5   # the bound is not loose by orders of magnitude


def test_exact_one_step_audit_on_random_neighbours():
  rng = np.random.default_rng(1)
  sel = selector()
  worst = 0.0
  for trial in range(60):
    size = int(rng.integers(1, B - 1))
    logits, with_doc, public = cluster(rng, size)
    if trial % 2:   # the public row disagrees with every document on the top token
      logits[:size, 0] = 12.0
      logits[B - 1, 1] = 12.0
    make_extreme(logits, trial % V)
    without = without_first(with_doc)
    a = outcome_log_probs(*step_parts(sel, logits, with_doc, public))
    b = outcome_log_probs(*step_parts(sel, logits, without, public))
    worst = max(worst, np.abs(a - b).max())
  assert worst <= CLAIMED * (1 + 1e-6), (worst, CLAIMED)
  assert worst >= 0.3 * CLAIMED   # the differing document is visible


@functools.partial(jax.jit, static_argnums=(0, 5))
def sampled_steps(sel, keys, logits, doc_mask, public_mask, n):
  del n
  def one(key):
    state = sel.initial_state(key)
    tokens, (_, paid, _) = sel.step(jax.random.fold_in(key, 0), logits, (doc_mask, public_mask),
                                 state)
    return tokens[0], paid
  return jax.vmap(one)(keys)


def test_sampled_step_matches_the_closed_form():
  rng = np.random.default_rng(2)
  sel = selector()
  logits, doc_mask, public = cluster(rng, 5)
  logits[:5, 0] = 10.0
  logits[B - 1, 1] = 10.0      # gap of a few documents: the test is far from certain
  n = 100_000
  keys = jax.random.split(jax.random.PRNGKey(0), n)
  tokens, paid = map(np.asarray, sampled_steps(sel, keys, logits, doc_mask, public, n))
  gap, public_token, log_p = step_parts(sel, logits, doc_mask, public)
  above = laplace_difference_sf(THRESHOLD - float(gap), EPS_TEST)
  assert 0.2 < above < 0.8
  lo, hi = stats.binomtest(int(paid.sum()), n).proportion_ci(0.999)
  assert lo <= above <= hi
  expected = np.exp(outcome_log_probs(gap, public_token, log_p))
  counts = np.bincount(tokens, minlength=V)
  assert stats.chisquare(counts, expected * n).pvalue > 1e-4
  # Below the test the public token is emitted, never another one.
  assert np.all(tokens[paid == 0] == int(public_token))


def test_selector_refuses_bad_settings():
  base = privacy.PrivateTokenSelector(c=C, tau=TAU)
  with pytest.raises(ValueError, match="public row"):
    privacy.SparseVectorSelector(base=base)
  with pytest.raises(ValueError, match="epsilon_test"):
    selector().__class__(base=selector().base, epsilon_test=0.0)
  with pytest.raises(ValueError, match="paid"):
    selector(paid=0)


@pytest.mark.parametrize("accountant", ["closed_form", "rdp"])
def test_svt_calibration_spends_exactly_its_budget(accountant):
  cal = privacy.calibrate(5.0, 1e-3, K=10, L=5, T=70, accountant=accountant, svt_paid=20,
                          svt_share=0.3)
  assert cal.paid_tokens == 20
  # Each instance takes 30 % of its paid token's rho.
  rho_token = privacy.token_rho(cal.c, cal.tau)
  assert privacy.svt_rho(cal.epsilon_test) == pytest.approx(rho_token * 0.3 / 0.7, rel=1e-12)
  spent = cal.eps_closed_form() if accountant == "closed_form" else cal.eps_rdp()
  assert spent == pytest.approx(5.0, rel=1e-9)
  # Independent of accounting.py's composition: Theorem 1 written out by hand.
  by_hand = (10 / (2 * cal.sigma_h**2) + 5 * (0.4**2 / 8 + 1 / (2 * cal.sigma_mu**2) +
                                              20 * (0.5 * (cal.c / cal.tau)**2 +
                                                    0.5 * cal.epsilon_test**2)))
  assert cal.rho_total == pytest.approx(by_hand, rel=1e-12)
  if accountant == "rdp":
    rdp = dp_rdp_epsilon(by_hand, 1e-3)
    assert rdp == pytest.approx(5.0, rel=1e-6)
  # Fewer paid tokens than T buy a larger c than the paper's T tokens at the same budget.
  paper = privacy.calibrate(5.0, 1e-3, K=10, L=5, T=70, accountant=accountant)
  assert cal.c > paper.c


def dp_rdp_epsilon(rho, delta):
  """epsilon of a plain rho-zCDP curve by dp_accounting's RDP accountant."""
  import dp_accounting   # pylint: disable=g-import-not-at-top
  from dp_accounting import rdp as dp_rdp  # pylint: disable=g-import-not-at-top
  acc = dp_rdp.RdpAccountant(list(accounting.DEFAULT_ORDERS))
  acc.compose(dp_accounting.ZCDpEvent(rho=rho))
  return acc.get_epsilon(delta)


@pytest.mark.parametrize("accountant", ["closed_form", "rdp"])
def test_ledger_of_svt_clusters_lands_on_the_budget(accountant, tmp_path):
  cal = privacy.calibrate(3.0, 1e-3, K=10, L=2, T=30, accountant=accountant, svt_paid=8)
  ledger = privacy.ResumableLedger(str(tmp_path / "ledger.json"), cal)
  ledger.record_histogram(cal.K, cal.sigma_h)
  for r in range(6):
    ledger.record_cluster_mean(r, cal.sigma_mu)
    ledger.record_threshold(r, cal.eps_theta)
    ledger.record_tokens(r, cal.paid_tokens, cal.c, cal.tau)
    ledger.record_sparse_vector(r, cal.svt_paid, cal.epsilon_test)
  assert ledger.ledger.spent_epsilon() == pytest.approx(3.0, rel=1e-9)
  # A second charge of the same cluster is not recorded twice (resume).
  ledger.record_sparse_vector(0, cal.svt_paid, cal.epsilon_test)
  assert ledger.ledger.spent_epsilon() == pytest.approx(3.0, rel=1e-9)
  with pytest.raises(privacy.BudgetExceededError):
    ledger.ledger.record_sparse_vector(0, 1, 1.0)


@pytest.fixture(scope="module")
def tiny_lm():
  return load_lm("tiny-random")


NOTES = ["Given the symptoms (fever, cough) of Ana Lopez. The diagnosis is Flu.",
         "Given the symptoms (fever, rash) of Bo Kim. The diagnosis is Measles.",
         "Given the symptoms (cough) of Cy Diaz. The diagnosis is Cold."]


def test_decode_pays_only_above_the_test(tiny_lm):
  eos = (-1,)   # no early end: every text runs T steps
  lm = type(tiny_lm)(tiny_lm.config, tiny_lm.params, tiny_lm.tokenizer, tiny_lm.dtype,
                     eos_ids=eos, source=tiny_lm.source)
  T, key = 12, jax.random.PRNGKey(3)
  make = lambda threshold, paid: PrivatePredictor(
      lm, c=0.5, tau=1.0, T=T, svt=dict(threshold=threshold, epsilon_test=1.0, paid=paid))
  suffixes = make(1.0, 4).suffixes(NOTES)

  def decode(pp):
    shape = pp.shape_of(suffixes)
    tokens, paid = pp.decode_group_paid([suffixes], [key], shape)
    return tokens[0], paid[0]

  never, never_paid = decode(make(1e9, 4))       # the test never fires: all public tokens
  always, always_paid = decode(make(-1e9, 5))    # it always fires, until 5 are paid
  assert never_paid == 0 and always_paid == 5
  assert len(never) == len(always) == T
  # The public row's greedy continuation of the prompt with no document.
  public = lm.generate_ids([make(1.0, 4).prompt.format(d="")], T, temperature=0.0)[0]
  assert never == public[:T]
  # After the 5 paid tokens, the text goes on with the public row's top tokens.
  assert always[:5] != never[:5]
  paid_counts = {}
  from dpsynrag_jax import private_decode  # pylint: disable=g-import-not-at-top
  pp = make(2.0, 6)
  private_decode.decode_many(pp, {0: suffixes, 1: []}, lambda r: jax.random.fold_in(key, r),
                             paid=paid_counts)
  assert set(paid_counts) == {0, 1} and all(0 <= p <= 6 for p in paid_counts.values())


def test_a_public_hint_is_what_the_public_row_reads(tiny_lm):
  lm = type(tiny_lm)(tiny_lm.config, tiny_lm.params, tiny_lm.tokenizer, tiny_lm.dtype,
                     eos_ids=(-1,), source=tiny_lm.source)
  T, key = 10, jax.random.PRNGKey(4)
  pp = PrivatePredictor(lm, c=0.5, tau=1.0, T=T,
                        svt=dict(threshold=1e9, epsilon_test=1.0, paid=4))  # never pays
  suffixes = pp.suffixes(NOTES)
  hinted = pp.decode_group([suffixes], [key], pp.shape_of(suffixes, "fever"), ["fever"])[0]
  # All free tokens: the greedy continuation of the prompt with the hint as its document.
  assert hinted == lm.generate_ids([pp.prompt.format(d="fever")], T, temperature=0.0)[0][:T]
  plain = pp.decode_group([suffixes], [key], pp.shape_of(suffixes))[0]
  assert plain == lm.generate_ids([pp.prompt.format(d="")], T, temperature=0.0)[0][:T]
  from dpsynrag_jax import private_decode  # pylint: disable=g-import-not-at-top
  many = private_decode.decode_many(pp, {0: suffixes, 1: []}, lambda r: key,
                                    hint_of=lambda r: "fever")
  assert many[0] == hinted and many[1] == hinted   # an empty cluster's text is its hint's
  with pytest.raises(ValueError, match="hints for"):
    pp.pack_group([suffixes], pp.shape_of(suffixes), ["a", "b"])
