"""Every experiment and launch module imports into one process (flags are defined only when an
app runs, so apps can be imported side by side by tests, sweeps and notebooks)."""

import importlib
import pkgutil

import experiments
import launch


def test_every_app_module_imports_alongside_the_others():
  names = []
  for package in (experiments, launch):
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
      importlib.import_module(info.name)
      names.append(info.name)
  assert "experiments.demo" in names and "launch.sweep" in names
