"""The apps' Hydra configs (``pkg://conf``). Importing this package, which Hydra does before it reads a
primary config, registers the ``catalog`` config source that serves the ``model`` group from the model
catalog (:mod:`planner.apps.model_catalog`)."""

from planner.apps.model_catalog import register

register()
