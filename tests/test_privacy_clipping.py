"""Logit clipping: bounds, masked rows, the Grislain formula, non-finite logits."""

import functools

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpsynrag_jax import privacy

B, V = 6, 32
METHODS = ("grislain", "clamp")


@functools.partial(jax.jit, static_argnames=("method",))
def clip_and_sum(logits, row_mask, c, alpha, method):
  return (privacy.clip_logits(logits, c, method=method, alpha=alpha),
          privacy.clipped_logit_sum(logits, row_mask, c, method=method, alpha=alpha))


def grislain_reference(logits, c, alpha=1.0):
  """The paper's formula in float64 NumPy, row by row."""
  out = []
  for row in np.asarray(logits, np.float64):
    normed = (np.exp(alpha * (row - row.max())) - 1) / alpha
    centred = normed - (normed.max() + normed.min()) / 2
    norm = np.abs(centred).max()
    out.append(centred * (min(1.0, c / norm) if norm > 0 else 1.0))
  return np.stack(out)


def logit_cases():
  rng = np.random.default_rng(0)
  random = rng.normal(0, 3, (B, V))
  huge = rng.normal(0, 1, (B, V)) * 1e30
  huge[0, 0] = 3e38
  tied = np.full((B, V), 7.0)
  tied[1] = -1e20
  masked = rng.normal(0, 3, (B, V))
  masked[:, V // 2:] = -np.inf
  masked[2, :] = -np.inf  # a row with nothing allowed
  masked[3, 1:] = -np.inf  # a row with one allowed token
  return {"random": random, "huge": huge, "tied": tied, "minus_inf": masked}


CASES = logit_cases()
ROW_MASK = np.array([True, True, True, True, False, False])


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("c", [0.05, 0.4, 3.0])
@pytest.mark.parametrize("case", sorted(CASES))
def test_clipped_rows_within_bounds_and_masked_rows_zero(case, c, method):
  logits = jnp.asarray(CASES[case], jnp.float32)
  clipped, summed = clip_and_sum(logits, jnp.asarray(ROW_MASK), c, 1.0, method)
  clipped = np.asarray(clipped)
  assert np.all(np.isfinite(clipped))
  assert np.all(np.abs(clipped) <= c)
  expected = clipped[ROW_MASK].sum(axis=0)
  np.testing.assert_allclose(np.asarray(summed), expected, rtol=1e-6, atol=1e-6)
  # No real row at all: exactly zero, whatever the padded rows hold.
  _, empty = clip_and_sum(logits, jnp.zeros(B, bool), c, 1.0, method)
  assert np.all(np.asarray(empty) == 0.0)


def test_padded_rows_contribute_exactly_zero_even_when_nan():
  logits = np.array(CASES["random"], np.float32)
  logits[4:] = np.nan
  logits[5, 0] = np.inf
  for method in METHODS:
    _, with_junk = clip_and_sum(jnp.asarray(logits), jnp.asarray(ROW_MASK), 0.4, 1.0, method)
    _, only_real = clip_and_sum(jnp.asarray(logits[:4]), jnp.ones(4, bool), 0.4, 1.0, method)
    np.testing.assert_array_equal(np.asarray(with_junk), np.asarray(only_real))


@pytest.mark.parametrize("alpha", [1.0, 0.3, 2.0])
def test_grislain_matches_the_formula(alpha):
  logits = CASES["random"]
  ours = np.asarray(privacy.clip_logits_grislain(jnp.asarray(logits, jnp.float32), 0.2, alpha))
  np.testing.assert_allclose(ours, grislain_reference(logits, 0.2, alpha), atol=2e-6)


def test_grislain_properties():
  logits = jnp.asarray(CASES["random"], jnp.float32)
  clipped = np.asarray(privacy.clip_logits_grislain(logits, 0.2))
  # A row whose exp-normalised range exceeds 2c spans exactly [-c, c], its argmax at +c.
  np.testing.assert_allclose(clipped.max(axis=1), 0.2, rtol=1e-6)
  np.testing.assert_allclose(clipped.min(axis=1), -0.2, rtol=1e-6)
  assert np.all(clipped.argmax(axis=1) == np.asarray(logits).argmax(axis=1))
  # Only the shape of a row matters, not its offset.
  shifted = np.asarray(privacy.clip_logits_grislain(logits + 10.0, 0.2))
  np.testing.assert_allclose(shifted, clipped, atol=1e-5)
  # Masked tokens land on the lowest value, they are not dropped.
  masked = np.asarray(privacy.clip_logits_grislain(jnp.asarray(CASES["minus_inf"]), 0.2))
  np.testing.assert_allclose(masked[0, V // 2:], -0.2, rtol=1e-6)
  assert np.all(masked[2] == 0.0)
  # With alpha = 1 the exp-normalised range is below 1, so the output never exceeds 1/2.
  assert np.abs(np.asarray(privacy.clip_logits_grislain(logits, 5.0))).max() <= 0.5


def test_clamp_is_entrywise():
  logits = jnp.array([[-np.inf, -3.0, 0.1, 2.0, 1e30]], jnp.float32)
  np.testing.assert_allclose(np.asarray(privacy.clip_logits_clamp(logits, 1.0)),
                             [[-1.0, -1.0, 0.1, 1.0, 1.0]])


def test_unknown_method():
  with pytest.raises(ValueError, match="Unknown clipping method"):
    privacy.clip_logits(jnp.zeros((1, 3)), 1.0, method="l2")


finite_or_minus_inf = st.one_of(
    st.floats(-2.0**100, 2.0**100, width=32), st.sampled_from([-np.inf, 0.0, 1.0]))


@settings(max_examples=60, deadline=None)
@given(logits=hnp.arrays(np.float32, (B, V), elements=finite_or_minus_inf),
       row_mask=hnp.arrays(np.bool_, (B,)),
       c=st.floats(1e-3, 10.0),
       method=st.sampled_from(METHODS))
def test_clipping_property(logits, row_mask, c, method):
  clipped, summed = clip_and_sum(jnp.asarray(logits), jnp.asarray(row_mask), c, 1.0, method)
  clipped, summed = np.asarray(clipped), np.asarray(summed)
  assert np.all(np.isfinite(clipped)) and np.all(np.abs(clipped) <= np.float32(c))
  np.testing.assert_allclose(summed, clipped[row_mask].sum(axis=0), rtol=1e-5,
                             atol=1e-5 * max(c, 1.0))
  # The sum of n real rows stays within n * c.
  assert np.all(np.abs(summed) <= row_mask.sum() * np.float32(c) * (1 + 1e-6))


@pytest.mark.parametrize("method", ["grislain", "clamp", "difference"])
def test_a_nan_row_stays_within_c_of_the_sum_without_it(method):
  """One broken document row (NaN, +inf) moves the sum by at most c and keeps it finite."""
  c = 0.1
  rng = np.random.default_rng(3)
  good = rng.normal(0, 3, (3, V)).astype(np.float32)
  broken = np.full((1, V), np.nan, np.float32)
  broken[0, :4] = np.inf
  broken[0, 4:8] = 2.0
  logits = jnp.asarray(np.concatenate([good, broken]))
  public = jnp.asarray(rng.normal(0, 3, V).astype(np.float32))

  def total(rows):
    mask = jnp.arange(4) < rows
    if method == "difference":
      return np.asarray(privacy.difference_clipped_sum(logits, mask, public, c))
    return np.asarray(privacy.clipped_logit_sum(logits, mask, c, method=method))

  with_row, without = total(4), total(3)
  assert np.all(np.isfinite(with_row))
  assert np.max(np.abs(with_row - without)) <= c * (1 + 1e-6)


def test_a_nan_row_does_not_decide_the_token():
  """Through the private decode's selector: the token still follows the other documents
  (token 0 every step was the failure: argmax over an all-NaN sum)."""
  from dpsynrag_jax.privacy import PrivateTokenSelector
  selector = PrivateTokenSelector(c=1.0, tau=0.05)
  logits = np.zeros((4, V), np.float32)
  logits[:3, 7] = 10.0           # three documents agree on token 7
  logits[3] = np.nan             # one broken row
  aux = (jnp.ones(4, bool), jnp.zeros(4, bool))
  tokens = [int(selector(jax.random.PRNGKey(k), jnp.asarray(logits), aux)[0]) for k in range(20)]
  assert tokens.count(7) >= 18
