"""Shared fixtures. Expensive models load once per test session."""

import os
import shutil
import tempfile

# Tests run on the CPU; keep XLA from grabbing every core's worth of threads per process.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# One persistent XLA compilation cache per test session, shared by every process the session
# starts (subprocesses inherit the environment): the suite builds the same tiny models and
# pipelines in many tests, fresh encoder and model instances and CLI subprocesses, and each
# would otherwise compile the same programs again. Tracing still happens per function, so the
# tests that count compiled programs (trace counters) are unaffected. A fresh folder per
# session: nothing compiled by an earlier checkout is ever reused. Under pytest-xdist the
# workers inherit the folder the controller made, and only the controller removes it.
_XLA_CACHE = None
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  _XLA_CACHE = tempfile.mkdtemp(prefix="dpsynrag-test-xla-cache-")
  os.environ["JAX_COMPILATION_CACHE_DIR"] = _XLA_CACHE
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

from hypothesis import settings  # pylint: disable=g-import-not-at-top
import pytest  # pylint: disable=g-import-not-at-top

# Property tests draw the same examples on every run (a failure reproduces, CI never flakes on
# a lucky draw), with no per-example deadline (shared 2-core machines stall at random).
settings.register_profile("derandomized", derandomize=True, deadline=None)
settings.load_profile("derandomized")


@pytest.fixture(scope="session")
def smollm2():
  """The embedded SmolLM2-135M-Instruct (GGUF), fp32."""
  from dpsynrag_jax.models import load_lm
  return load_lm("smollm2-135m-instruct")


def pytest_collection_modifyitems(items):
  """Tests that load the embedded SmolLM2 (the `smollm2` fixture) are slow: `make test-fast`
  leaves them out, `make test` runs them."""
  for item in items:
    if "smollm2" in getattr(item, "fixturenames", ()):
      item.add_marker(pytest.mark.slow)


def pytest_sessionfinish(session, exitstatus):
  del session, exitstatus
  if _XLA_CACHE is not None:
    shutil.rmtree(_XLA_CACHE, ignore_errors=True)
