"""Where a compiled program's time goes, by the line of our code that emitted each op.

    text = jitted.lower(*args).compile().as_text()      # the optimized module, with frames
    with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
      jax.block_until_ready(jitted(*args))
    rows = attribute(op_events(trace_dir, module_name(text)), source_lines(text))

The trace holds one event per executed op (hlo_op, hlo_module, microseconds); the
optimized module names each instruction's stack frame, whose innermost entry is the source line
that emitted it. Ops of one program run on several threads at once on a CPU, so the sums are
op time (CPU time while an op runs), not wall time: their total over the wall time of the call
says how many cores were busy on average.
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import re
from typing import Iterable, Sequence

UNMAPPED = "(no source line)"

_TABLES = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+) = .*?metadata=\{([^}]*)\}")
_MODULE = re.compile(r"^HloModule\s+([\w.\-]+)")


def module_name(hlo_text: str) -> str:
  """The module's name from its first line ('jit_per_device')."""
  match = _MODULE.match(hlo_text)
  if not match:
    raise ValueError("not an HLO module's text (Compiled.as_text())")
  return match.group(1)


def _tables(lines: Sequence[str]) -> dict[str, dict[str, str]]:
  """The module's numbered tables (FileNames ... StackFrames): name -> {id: entry text}."""
  tables: dict[str, dict[str, str]] = {name: {} for name in _TABLES}
  current = None
  for line in lines:
    text = line.strip()
    if text in _TABLES:
      current = text
    elif current and re.match(r"^\d+ ", text):
      number, entry = text.split(" ", 1)
      tables[current][number] = entry
    elif text:
      current = None
  return tables


def source_lines(hlo_text: str) -> dict[str, str]:
  """Each instruction of an optimized module -> 'file.py:line function' of the innermost frame
  of its stack (the line of our code that emitted it), or its op_name without one."""
  lines = hlo_text.split("\n")
  tables = _tables(lines)
  fields = lambda entry: dict(re.findall(r"(\w+)=(\d+)", entry))
  files = {k: os.path.basename(v.strip('"')) for k, v in tables["FileNames"].items()}
  functions = {k: v.strip('"') for k, v in tables["FunctionNames"].items()}
  locations = {}
  for k, entry in tables["FileLocations"].items():
    f = fields(entry)
    locations[k] = f"{files[f['file_name_id']]}:{f['line']} {functions[f['function_name_id']]}"
  frames = {k: fields(entry)["file_location_id"] for k, entry in tables["StackFrames"].items()}
  out = {}
  for line in lines:
    match = _INSTRUCTION.match(line)
    if not match:
      continue
    name, metadata = match.groups()
    frame = re.search(r"stack_frame_id=(\d+)", metadata)
    op_name = re.search(r'op_name="([^"]+)"', metadata)
    if frame and frame.group(1) in frames:
      out[name] = locations[frames[frame.group(1)]]
    elif op_name:
      out[name] = op_name.group(1)
  return out


def op_events(trace_dir: str, module: str) -> list[dict]:
  """The executed ops of `module` in the perfetto trace under trace_dir: [{'op', 'us'}], one
  per execution."""
  paths = glob.glob(os.path.join(trace_dir, "**", "*perfetto_trace.json.gz"), recursive=True)
  if not paths:
    raise FileNotFoundError(f"no perfetto trace under {trace_dir} (jax.profiler.trace with "
                            "create_perfetto_trace=True writes one)")
  with gzip.open(max(paths, key=os.path.getmtime)) as f:
    trace = json.load(f)
  events = trace["traceEvents"] if isinstance(trace, dict) else trace
  return [{"op": e["args"]["hlo_op"], "us": float(e.get("dur", 0.0))}
          for e in events
          if e.get("ph") == "X" and e.get("args", {}).get("hlo_module") == module
          and "hlo_op" in e.get("args", {})]


def attribute(events: Iterable[dict], lines: dict[str, str], by: str = "line"
              ) -> list[dict]:
  """Op time per source line (by='line') or per function (by='function': 'file.py function'),
  largest first: [{'source', 'ms', 'share', 'executions', 'ops'}]; ops with no frame go to
  UNMAPPED. share is of the total op time."""
  if by not in ("line", "function"):
    raise ValueError(f"by must be 'line' or 'function', got {by!r}")
  us = collections.Counter()
  executions = collections.Counter()
  ops = collections.defaultdict(set)
  for e in events:
    source = lines.get(e["op"], UNMAPPED)
    if by == "function" and source != UNMAPPED and ":" in source and " " in source:
      where, function = source.split(" ", 1)
      source = f"{where.split(':')[0]} {function}"
    us[source] += e["us"]
    executions[source] += 1
    ops[source].add(e["op"])
  total = sum(us.values()) or 1.0
  return [{"source": s, "ms": t / 1e3, "share": t / total, "executions": executions[s],
           "ops": len(ops[s])} for s, t in us.most_common()]


def markdown(rows: Sequence[dict], top: int, per: float = 1.0, per_name: str = "") -> str:
  """The first `top` rows as a table; with per, each time also divided by it (per step)."""
  head = "| source | op ms | share |" + (f" ms per {per_name} |" if per_name else "")
  lines = [head, "|---|---|---|" + ("---|" if per_name else "")]
  for r in rows[:top]:
    cells = f"| {r['source']} | {r['ms']:.1f} | {100 * r['share']:.1f} % |"
    lines.append(cells + (f" {r['ms'] / per:.2f} |" if per_name else ""))
  return "\n".join(lines)
