"""A group of clusters over several devices: each cluster's arithmetic is its own.

Several host devices need XLA_FLAGS set before jax starts, so the check runs in a subprocess.
"""

import os
import subprocess
import sys
import textwrap

_SCRIPT = textwrap.dedent("""
    import os
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax
    import numpy as np
    from dpsynrag_jax.models import inference, load_lm
    from dpsynrag_jax.models.language_model import bucket_length
    from dpsynrag_jax import private_decode
    from dpsynrag_jax.private_decode import PrivatePredictor

    assert jax.local_device_count() == 4
    lm = load_lm("tiny-random")
    group_pp = PrivatePredictor(lm, c=0.5, tau=1.0, T=6)
    one_pp = PrivatePredictor(lm, c=0.5, tau=1.0, T=6, devices=jax.local_devices()[:1])
    rng = np.random.default_rng(0)
    words = ["fever", "cough", "rash", "ache", "chill", "nausea", "dizzy", "pale"]
    text = lambda n: " ".join(rng.choice(words, n))

    # One long document each (the first prefill chunk, and the shape, are the same for all);
    # the other 19 rows (the second chunk holds the shortest 8 of the 24 padded rows) are
    # short, long or in between, so the second chunk pads to 16, 96 or 48 on its own.
    clusters = {name: group_pp.suffixes([text(70)] + [text(n) for _ in range(19)])
                for name, n in (("short", 2), ("long", 70), ("medium", 30))}
    shape = group_pp.shape_of(clusters["short"])
    assert all(group_pp.shape_of(c) == shape for c in clusters.values()), shape
    second = {name: bucket_length(min(len(s) for s in c)) for name, c in clusters.items()}
    assert second == {"short": 16, "long": 96, "medium": 48}, second

    def prefill(pp, names):
      # Each cluster's rows of the prefilled logits and cache, by name (pack 1: device g holds
      # the group's g-th cluster; the group's other devices hold empty clusters).
      cache, logits = pp.prefill_group(pp.pack_group([clusters[n] for n in names], shape))
      leaves = [np.asarray(a) for a in jax.tree.leaves((logits, cache)) if np.ndim(a) >= 2]
      return {n: [a[g] for a in leaves] for g, n in enumerate(names)}

    def decode(pp, names):
      tokens = pp.decode_group([clusters[n] for n in names],
                               [jax.random.PRNGKey(len(n)) for n in names], shape)
      return dict(zip(names, tokens))

    group = ["long", "short", "medium"]        # 'short' on device 1, beside longer chunks
    grouped, grouped_tokens = prefill(group_pp, group), decode(group_pp, group)
    for pp, label in ((group_pp, "alone on 4 devices"), (one_pp, "alone on 1 device")):
      for name in group:
        alone = prefill(pp, [name])[name]
        same = [a.tobytes() == b.tobytes() for a, b in zip(alone, grouped[name])]
        assert all(same), f"{name}: prefill {label} differs from grouped: {same}"
        assert decode(pp, [name])[name] == grouped_tokens[name], f"{name}: tokens, {label}"

    # The active flag is a traced input: other placements of the same chunk shapes compile
    # nothing new.
    before = inference.TRACE_COUNTS["private_prefill"]
    prefill(group_pp, ["medium", "long", "short"])
    assert inference.TRACE_COUNTS["private_prefill"] == before
    print("ok")
    """)


def test_a_clusters_prefill_does_not_depend_on_the_clusters_on_other_devices():
  """4 host devices: a cluster's prefilled logits and cache rows, bit for bit, and its decoded
  tokens are the same decoded alone (on 4 devices or 1) as beside clusters whose second prefill
  chunk pads to another bucket (its own rows pad to 16, theirs to 48 and 96): each device pads a
  chunk to its own rows' bucket, so no cluster's rounding depends on another's documents."""
  env = dict(os.environ)
  env.pop("XLA_FLAGS", None)
  proc = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=os.getcwd(), env=env,
                        capture_output=True, text=True, check=False)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
  assert proc.stdout.strip().endswith("ok")
