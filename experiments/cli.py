"""The flags every experiment app takes, defined when the app runs (not on import), so that
tests and other apps can import several apps into one process."""

from typing import Callable

from absl import app
from absl import flags
from ml_collections import config_flags

FLAGS = flags.FLAGS


def define_config_and_workdir(config_help: str, config_required: bool = True) -> None:
  config_flags.DEFINE_config_file("config", None, config_help, lock_config=True)
  flags.DEFINE_string("workdir", None, "Directory for results and builds.")
  flags.mark_flags_as_required(["config", "workdir"] if config_required else ["workdir"])


def run_app(run: Callable[..., object], config_help: str) -> None:
  """Defines the flags and runs `run(config, workdir)` as an absl app (an app's __main__)."""

  def main(argv):
    if len(argv) > 1:
      raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    run(FLAGS.config, FLAGS.workdir)

  define_config_and_workdir(config_help)
  app.run(main)
