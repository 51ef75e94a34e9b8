"""host_memory: freed heap pages go back to the OS."""

import ctypes
import ctypes.util
import platform

import pytest

from dpsynrag_jax import host_memory


@pytest.mark.skipif(platform.system() != "Linux", reason="glibc's malloc_trim and /proc")
def test_release_freed_memory_returns_fragmented_heap_pages():
  libc = ctypes.CDLL(ctypes.util.find_library("c"))
  libc.malloc.restype = ctypes.c_void_p
  libc.malloc.argtypes = [ctypes.c_size_t]
  libc.free.argtypes = [ctypes.c_void_p]
  # 2048 blocks of 64 KiB (under the mmap threshold: they come from the heap), written so their
  # pages are resident, each followed by a small live block; freeing the large ones leaves
  # 128 MiB free in holes of the heap, which free() cannot give back and malloc_trim can.
  blocks, pins = [], []
  for _ in range(2048):
    blocks.append(libc.malloc(64 << 10))
    pins.append(libc.malloc(4 << 10))
    ctypes.memset(blocks[-1], 1, 64 << 10)
  for b in blocks:
    libc.free(b)
  before = host_memory.resident_gb()
  assert host_memory.release_freed_memory()
  after = host_memory.resident_gb()
  for p in pins:
    libc.free(p)
  assert before - after > 0.1, (before, after)   # most of the 0.125 GiB came back


@pytest.mark.skipif(platform.system() != "Linux", reason="/proc and ru_maxrss in KiB")
def test_peak_resident_covers_memory_touched_then_freed():
  # 256 MiB touched then freed: the resident size drops back, the peak keeps it.
  before = host_memory.peak_resident_gb()
  block = bytearray(256 << 20)
  block[::4096] = b"\x01" * len(block[::4096])
  during = host_memory.resident_gb()
  del block
  peak = host_memory.peak_resident_gb()
  assert peak >= during - 1e-3 and peak >= before
  assert peak - host_memory.resident_gb() > 0.2 or before > during   # freed, but remembered
