"""Profiling: ops of a compiled program mapped to the source lines that emitted them."""

import inspect

import jax
import jax.numpy as jnp
import pytest

from dpsynrag_jax import profiling


def _program(x, w):
  h = jnp.tanh(x @ w)          # the matmul and the tanh: this line
  return jnp.sum(h * h)        # the product and the sum: this one


def test_each_op_of_a_traced_program_is_charged_to_its_source_line(tmp_path):
  x, w = jnp.ones((256, 256)), jnp.full((256, 256), 0.01)
  jitted = jax.jit(_program)
  text = jitted.lower(x, w).compile().as_text()
  module = profiling.module_name(text)
  assert module == "jit__program"
  lines = profiling.source_lines(text)
  first = inspect.getsourcelines(_program)[1] + 1
  here = {f"test_profiling.py:{n} _program" for n in (first, first + 1)}
  assert here & set(lines.values())
  jax.block_until_ready(jitted(x, w))
  with jax.profiler.trace(str(tmp_path), create_perfetto_trace=True):
    for _ in range(3):
      jax.block_until_ready(jitted(x, w))
  events = profiling.op_events(str(tmp_path), module)
  assert events and all(e["us"] >= 0 for e in events)
  assert profiling.op_events(str(tmp_path), "jit_no_such_module") == []
  rows = profiling.attribute(events, lines)
  assert sum(r["share"] for r in rows) == pytest.approx(1.0)
  assert sum(r["executions"] for r in rows) == len(events)
  assert [r["ms"] for r in rows] == sorted((r["ms"] for r in rows), reverse=True)
  # Nearly all the time is in the two lines of _program (a few copies may have no frame).
  assert sum(r["share"] for r in rows if r["source"] in here) > 0.5
  functions = profiling.attribute(events, lines, by="function")
  assert "test_profiling.py _program" in {r["source"] for r in functions}
  table = profiling.markdown(rows, top=2, per=3, per_name="call")
  assert table.splitlines()[0] == "| source | op ms | share | ms per call |"
  assert len(table.splitlines()) == 2 + min(2, len(rows))
  with pytest.raises(ValueError):
    profiling.attribute(events, lines, by="file")
  with pytest.raises(FileNotFoundError):
    profiling.op_events(str(tmp_path / "empty"), module)


@pytest.mark.slow
def test_profile_decode_charges_the_decode_to_the_decoder_and_the_token_mechanism(tmp_path):
  from experiments import profile_decode  # pylint: disable=g-import-not-at-top
  report = profile_decode.run("tiny-random", docs=4, T=3, trace_dir=str(tmp_path))
  assert report["T"] == 3 and report["rows"] >= 4
  assert report["traced_wall_s"] > 0 and report["op_s"] > 0
  assert report["unmapped_share"] < 0.2
  files = {r["source"].split(" ")[0] for r in report["by_function"]}
  assert {"decoder.py", "mechanisms.py", "clipping.py"} <= files
  by_line = {r["source"] for r in report["by_line"]}
  assert any(s.startswith("mechanisms.py:") and "sample_token" in s for s in by_line)
