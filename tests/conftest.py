"""Shared fixtures. Expensive models load once per test session."""

import os

# Tests run on the CPU; keep XLA from grabbing every core's worth of threads per process.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest  # pylint: disable=g-import-not-at-top


@pytest.fixture(scope="session")
def smollm2():
  """The embedded SmolLM2-135M-Instruct (GGUF), fp32."""
  from dpsynrag_jax.models import load_lm
  return load_lm("smollm2-135m-instruct")
