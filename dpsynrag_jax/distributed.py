"""Several processes (hosts) on one build: start-up, identity and barriers.

A process is one of several when SLURM started more than one task for the job step
(SLURM_NTASKS > 1; jax.distributed reads the coordinator from the SLURM environment), or when
DPSYNRAG_NUM_PROCESSES > 1 (with DPSYNRAG_COORDINATOR=host:port and DPSYNRAG_PROCESS_ID; this is
how tests start two processes on one machine). Otherwise everything here is a no-op, so
single-process runs never touch jax.distributed.
"""

from __future__ import annotations

import os

from absl import logging
import jax

ENV_COORDINATOR = "DPSYNRAG_COORDINATOR"
ENV_NUM_PROCESSES = "DPSYNRAG_NUM_PROCESSES"
ENV_PROCESS_ID = "DPSYNRAG_PROCESS_ID"


def _env_int(name: str) -> int | None:
  value = os.environ.get(name, "")
  if not value:
    return None
  try:
    return int(value)
  except ValueError:
    raise ValueError(f"{name} must be an integer, got {value!r}.") from None


def launched_processes() -> int:
  """How many processes this job was launched with (1 unless SLURM or the env say more)."""
  explicit = _env_int(ENV_NUM_PROCESSES)
  if explicit is not None:
    return explicit
  return _env_int("SLURM_NTASKS") or 1


def maybe_initialize() -> None:
  """jax.distributed.initialize once, when launched as one of several processes.

  Must run before the first JAX computation of the process (JAX's rule).
  """
  if launched_processes() <= 1 or jax.distributed.is_initialized():
    return
  if os.environ.get(ENV_NUM_PROCESSES):
    coordinator = os.environ.get(ENV_COORDINATOR, "")
    process_id = _env_int(ENV_PROCESS_ID)
    if not coordinator or process_id is None:
      raise ValueError(f"{ENV_NUM_PROCESSES} > 1 needs {ENV_COORDINATOR}=host:port and "
                       f"{ENV_PROCESS_ID}.")
    jax.distributed.initialize(coordinator, num_processes=launched_processes(),
                               process_id=process_id)
  else:
    jax.distributed.initialize()  # SLURM: coordinator, count and id from the environment
  logging.info("Process %d of %d (%d local devices).", jax.process_index(),
               jax.process_count(), jax.local_device_count())


def process_index() -> int:
  return jax.process_index()


def process_count() -> int:
  return jax.process_count()


def barrier(name: str) -> None:
  """Every process waits here until all have arrived (no-op for one process)."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    multihost_utils.sync_global_devices(name)
