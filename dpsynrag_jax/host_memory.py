"""Host memory: give the memory that freed device buffers leave behind back to the OS.

On CPU, XLA's buffers come from the C allocator. A build decodes its clusters in many padded
shapes, each with its own buffer sizes, and glibc keeps what they free in its heaps (per-layer
caches of a few MB fall under its mmap threshold), fragmented, so the process's resident size
grew to 12.7 GB over the paper_cpu build while the live buffers stayed those of one cluster
(BUILD_NOTES, "Peak RSS of the whole build"). malloc_trim(0) returns the free pages of every
heap; it costs milliseconds, nothing next to a cluster's decode.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import platform

try:
  import resource
except ImportError:   # Windows
  resource = None


@functools.lru_cache(maxsize=1)
def _libc():
  """glibc, or None where the C library has no malloc_trim (macOS, musl)."""
  name = ctypes.util.find_library("c")
  try:
    libc = ctypes.CDLL(name)
    libc.malloc_trim.argtypes = [ctypes.c_size_t]
    return libc
  except (OSError, AttributeError, TypeError):
    return None


def release_freed_memory() -> bool:
  """Returns the free pages of the C allocator's heaps to the OS; False where there is no
  malloc_trim to call (then nothing happens)."""
  libc = _libc()
  if libc is None:
    return False
  libc.malloc_trim(0)
  return True


def resident_gb() -> float:
  """This process's resident set size now, in GiB (Linux /proc; 0.0 elsewhere)."""
  try:
    with open("/proc/self/statm", encoding="ascii") as f:
      pages = int(f.read().split()[1])
  except OSError:
    return 0.0
  return pages * resource.getpagesize() / 2**30


def peak_resident_gb() -> float:
  """This process's largest resident set size so far, in GiB (ru_maxrss: KiB on Linux, bytes
  on macOS; 0.0 where there is no resource module)."""
  if resource is None:
    return 0.0
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  return peak / (2**30 if platform.system() == "Darwin" else 2**20)
