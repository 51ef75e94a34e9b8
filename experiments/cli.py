"""The flags every experiment app takes, defined when the app runs (not on import), so that
tests and other apps can import several apps into one process."""

import os
import sys
import traceback
from typing import Callable

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from dpsynrag_jax.synrag.workdir import WorkdirError

FLAGS = flags.FLAGS


def default_compilation_cache() -> str:
  """JAX's own setting when the environment gives one, else the user's cache folder."""
  if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    return os.environ["JAX_COMPILATION_CACHE_DIR"]
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "dpsynrag_jax", "xla")


def define_compilation_cache() -> None:
  flags.DEFINE_string(
      "compilation_cache", default_compilation_cache(),
      "Directory of JAX's persistent compilation cache, shared by every app and run; empty: "
      "off. A resumed build or a second build of the same shapes loads its compiled programs "
      "instead of compiling them again (the same programs, so the same bytes out).")


def use_compilation_cache(path: str) -> int:
  """Points JAX's persistent compilation cache at `path` (nothing when empty); returns how
  many entries it already holds (0: a cold cache), for reports that time compiles."""
  if not path:
    return 0
  import jax  # pylint: disable=g-import-not-at-top
  os.makedirs(path, exist_ok=True)
  jax.config.update("jax_compilation_cache_dir", path)
  entries = len(os.listdir(path))
  logging.info("JAX compilation cache %s (%d entries).", path, entries)
  return entries


def start_app() -> int:
  """What every app does first, once its flags are parsed: the compilation cache."""
  return use_compilation_cache(FLAGS.compilation_cache)


def define_config_and_workdir(config_help: str, config_required: bool = True) -> None:
  config_flags.DEFINE_config_file("config", None, config_help, lock_config=True)
  flags.DEFINE_string("workdir", None, "Directory for results and builds.")
  flags.mark_flags_as_required(["config", "workdir"] if config_required else ["workdir"])


# What a user can cause and mend: a bad setting, flag or corpus (ValueError and the data
# modules' errors derived from it), a missing or unreadable file (OSError), a work dir in
# another state (WorkdirError). They end the app with one line and exit status 2.
USER_ERRORS = (ValueError, OSError, WorkdirError, app.UsageError)
USER_ERROR_STATUS = 2


def _fail(message: str) -> None:
  print(f"error: {message}", file=sys.stderr)
  sys.exit(USER_ERROR_STATUS)


def _parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, with a bad flag value reported as a user error."""
  try:
    return FLAGS(argv)
  except flags.Error as e:
    _fail(f"{e} (--helpfull lists the flags)")
  except (AttributeError, KeyError) as e:
    # ml_collections raises these, not a flags.Error, for a --config.FIELD that names no field.
    overrides = [a.split("=")[0] for a in argv[1:] if a.startswith("--config.")]
    if not overrides or "--traceback" in argv:
      raise
    while e.args and isinstance(e.args[0], BaseException):   # AttributeError(KeyError(...))
      e = e.args[0]
    detail = str(e.args[0] if e.args else e).replace("\n", "; ")
    _fail(f"no config field {detail} (overrides: {', '.join(overrides)}; the fields are those "
          "of the --config file)")
  return []   # not reached


def run(main: Callable[[list[str]], object]) -> None:
  """absl's app.run(main), except that a user error (USER_ERRORS) ends the app with one line
  `error: ...` on stderr and exit status 2 instead of a traceback; --traceback shows it."""
  if "traceback" not in FLAGS:
    flags.DEFINE_bool("traceback", False, "On a user error (bad setting, missing file, work "
                      "dir in another state), print the whole traceback, not one line.")

  def guarded(argv):
    try:
      return main(argv)
    except USER_ERRORS as e:  # pylint: disable=catching-non-exception
      if FLAGS.traceback:
        traceback.print_exc()
      _fail(str(e) or type(e).__name__)

  app.run(guarded, flags_parser=_parse_flags)


def run_app(run_fn: Callable[..., object], config_help: str) -> None:
  """Defines the flags and runs `run_fn(config, workdir)` as an absl app (an app's __main__)."""

  def main(argv):
    if len(argv) > 1:
      raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    start_app()
    run_fn(FLAGS.config, FLAGS.workdir)

  define_config_and_workdir(config_help)
  define_compilation_cache()
  run(main)
