"""Fault injection: named points where a test can kill the process as a crash would.

The fault-injection tests kill a build with SIGKILL at points spread over its phases (between a
file's write and its rename, in the middle of an append, after a mechanism is charged and
before its output is saved) and check that the resumed build releases exactly what an
uninterrupted one does, with nothing charged twice. `DPSYNRAG_KILL_AT=NAME` kills at the first
time point NAME is reached, `NAME@N` at the N-th. Unset (every real run), a point does nothing.
"""

import os
import signal

_HITS: dict[str, int] = {}


def fault_point(name: str) -> None:
  """Ends the process with SIGKILL at the named point when DPSYNRAG_KILL_AT names it.

  The fault-injection tests kill a build at points spread over its phases and check that its
  resume releases exactly what an uninterrupted build does. 'NAME' kills at the first time the
  point is reached, 'NAME@N' at the N-th. Unset (every real run), it does nothing.
  """
  target = os.environ.get("DPSYNRAG_KILL_AT")
  if not target:
    return
  point, _, count = target.partition("@")
  if point != name:
    return
  _HITS[name] = _HITS.get(name, 0) + 1
  if _HITS[name] == int(count or 1):
    os.kill(os.getpid(), signal.SIGKILL)
