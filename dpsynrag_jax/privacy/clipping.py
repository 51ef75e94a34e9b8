"""Per-document logit clipping and the clipped sum that every private decoding step samples from.

Axis letters: B documents (rows of one cluster, padded to a bucket), V vocabulary.

Each document's next-token logits are mapped into [-c, c] before they are summed, so adding or
removing one document moves every entry of the sum by at most c (L_inf sensitivity c), and the
change of the whole vector lies in a box of width 2c. Sampling a token from softmax(sum / tau) is
then the exponential mechanism with bounded range 2c/tau: (2c/tau)-DP and (c/tau)^2/2-zCDP
(see `mechanisms.sample_token`).

Two clipping forms:
  * 'grislain' (Grislain, "RAG with differential privacy"; DP-SynRAG step 4):
      l_norm = (exp(alpha (l - max l)) - 1) / alpha      in [-1/alpha, 0]
      l_cent = l_norm - (max l_norm + min l_norm) / 2     symmetric around 0
      clip   = l_cent * min(1, c / ||l_cent||_inf)
    alpha = 1 is the paper's form (the -1 cancels in the centring); alpha -> 0 approaches raw
    logits. Only the shape of the distribution survives, not the logit scale, so one confident
    document cannot drown the others. The exp-normalised row spans at most 1/alpha, so after
    centring |l_cent| <= 1/(2 alpha): a c above 1/(2 alpha) clips nothing and is charged for
    nothing it buys (the paper's c/tau ~ 0.1 with alpha = 1 is far below 1/2).
  * 'clamp': clip(l, -c, c), entrywise.

Logits of -inf (a public vocabulary mask) are allowed: they land on the lowest clipped value,
they are never dropped, because dropping a token only where the data says so would make the
output support data dependent (infinite privacy loss). To exclude tokens, pass a public vocab
mask to `mechanisms.sample_token`.

Non-finite logits cannot decide a token: inside every clip, NaN maps to the lowest value (like
-inf) and +inf to the highest (like the row's maximum), so a broken document row still
contributes a vector in [-c, c] and the sum keeps its sensitivity (one NaN would otherwise make
the whole sum NaN, and argmax would return token 0 every step). NaN and +inf are still bugs
upstream (an overflow, an all-masked attention row); a broken row just stops counting.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

METHODS = ("grislain", "clamp")


def clipped_logit_sum_sensitivity(c: float) -> float:
  """L_inf sensitivity of `clipped_logit_sum` under add/remove-one-document neighbouring.

  One row contributes a vector with entries in [-c, c], so each token's summed utility moves by
  at most c (and the change vector of all tokens lies in a box of width 2c).
  """
  return float(c)


def finite_or_infinite(logits: jax.Array) -> jax.Array:
  """[..., V] float32 with NaN -> -inf and +inf -> the largest float32: every entry is then a
  number or -inf, which each clip maps into [-c, c] (NaN to the bottom, +inf to the top)."""
  logits = jnp.asarray(logits, jnp.float32)
  logits = jnp.where(jnp.isnan(logits), -jnp.inf, logits)
  return jnp.where(logits == jnp.inf, jnp.finfo(jnp.float32).max, logits)


def clip_logits_grislain(logits: jax.Array, c: float, alpha: float = 1.0) -> jax.Array:
  """Grislain's exp-normalise, centre, rescale clipping of each row.

  Args:
    logits: [..., V] float logits; -inf allowed; NaN is read as -inf and +inf as the largest
      float (see module doc).
    c: clipping bound, > 0.
    alpha: sharpness of the exp-normalisation, > 0; 1 is the paper's form.

  Returns:
    [..., V] float32 with every entry in [-c, c]. A row whose entries are all equal (or all -inf)
    maps to zeros.
  """
  logits = finite_or_infinite(logits)
  row_max = jnp.max(logits, axis=-1, keepdims=True)
  # An all -inf row would give -inf - -inf = NaN; treat it like a tied row (all zeros out).
  row_max = jnp.where(jnp.isfinite(row_max), row_max, 0.0)
  # expm1 keeps precision for logits close to the maximum, where exp(x) - 1 would cancel.
  normed = jnp.expm1(alpha * (logits - row_max)) / alpha
  hi = jnp.max(normed, axis=-1, keepdims=True)
  lo = jnp.min(normed, axis=-1, keepdims=True)
  centred = normed - (hi + lo) / 2
  norm = jnp.max(jnp.abs(centred), axis=-1, keepdims=True)
  # min(1, c / norm) without dividing by zero for tied rows (norm == 0, centred == 0).
  scale = jnp.where(norm > c, c / jnp.where(norm > 0, norm, 1.0), 1.0)
  # The product can exceed c by an ulp; the final clip makes the bound exact.
  return jnp.clip(centred * scale, -c, c)


def clip_logits_clamp(logits: jax.Array, c: float) -> jax.Array:
  """Entrywise clamp to [-c, c]; -inf and NaN become -c, +inf c. [..., V] -> [..., V] float32."""
  return jnp.clip(finite_or_infinite(logits), -c, c)


def clip_logits(logits: jax.Array, c: float, *, method: str = "grislain",
                alpha: float = 1.0) -> jax.Array:
  """Clips each row of [..., V] logits into [-c, c] with `method` in METHODS."""
  if method == "grislain":
    return clip_logits_grislain(logits, c, alpha)
  if method == "clamp":
    return clip_logits_clamp(logits, c)
  raise ValueError(f"Unknown clipping method {method!r}; expected one of {METHODS}.")


def clipped_logit_sum(logits: jax.Array, row_mask: jax.Array, c: float, *,
                      method: str = "grislain", alpha: float = 1.0) -> jax.Array:
  """Sum over documents of clipped logits: the utility of one private decoding step.

  Args:
    logits: [B, V] float32 next-token logits, one row per document (padded rows arbitrary, even
      NaN: they are discarded with `where`, not multiplied by 0).
    row_mask: [B] bool, True for real documents.
    c: clipping bound; the result has L_inf sensitivity c (`clipped_logit_sum_sensitivity`).
    method: 'grislain' or 'clamp' (static).
    alpha: Grislain sharpness (static or traced), ignored by 'clamp'.

  Returns:
    [V] float32, sum of clipped rows of real documents; all zeros when no row is real.
  """
  clipped = clip_logits(logits, c, method=method, alpha=alpha)
  row_mask = jnp.asarray(row_mask, bool)
  kept = jnp.where(row_mask[:, None], clipped, 0.0)
  # A ones-vector matmul: on CPU several times faster than a column reduction over [B, V]
  # (measured 9 ms vs 40 ms at 64 x 49152). HIGHEST keeps every product exact in float32.
  ones = jnp.ones((kept.shape[0],), jnp.float32)
  return jnp.matmul(ones, kept, precision=jax.lax.Precision.HIGHEST)


def difference_clipped_sum(logits: jax.Array, row_mask: jax.Array, reference: jax.Array,
                           c: float) -> jax.Array:
  """Difference clipping: sum over documents of clip(log p_i - log p_ref, -c, c).

  The reference is a public distribution (the same prompt with no document), so documents
  that agree with it contribute ~0 and the budget is spent only where they differ. The caller
  adds log p_ref back (public, free) to form the utility.

  Args:
    logits: [B, V] float32 next-token logits, one row per document (padded rows arbitrary).
    row_mask: [B] bool, True for real documents.
    reference: [V] float32 logits of the public reference row.
    c: bound; every row's contribution lies in [-c, c], so the L_inf sensitivity is c, exactly
      as for `clipped_logit_sum` (the ledger is unchanged).

  Returns:
    [V] float32.
  """
  log_p = jax.nn.log_softmax(finite_or_infinite(logits), axis=-1)
  log_ref = jax.nn.log_softmax(finite_or_infinite(reference), axis=-1)
  # -inf - -inf is NaN and -inf against a finite reference is -inf: both clip to an end of
  # [-c, c] (NaN to -c), never dropped, so the support does not depend on the data.
  diff = jnp.nan_to_num(log_p - log_ref[None], nan=-c, posinf=c, neginf=-c)
  kept = jnp.where(jnp.asarray(row_mask, bool)[:, None], jnp.clip(diff, -c, c), 0.0)
  ones = jnp.ones((kept.shape[0],), jnp.float32)
  return jnp.matmul(ones, kept, precision=jax.lax.Precision.HIGHEST)
