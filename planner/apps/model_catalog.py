"""The ``model`` config group, served from the model catalog: ``model=<preset | published id | config.json>``.

Hydra finds a group's options as YAML files; the catalog knows more than files could list: every preset
(:data:`simcore.models.MODEL_NAMES`), every published id of the same shape
(:func:`simcore.models.preset_for`: ``model=moonshotai/Kimi-K2.5``) and any ``config.json`` path. This
config source (scheme ``catalog``, on the apps' search path) answers ``model/<anything>`` with
``{name: <anything>}`` when the catalog resolves it, so the model is named one way on the command line,
in experiments and in ``model.name``. An unknown name is not an option Hydra can find; its one-line error
names the closest known ids (:func:`simcore.models.closest_ids`).
"""

from __future__ import annotations

import os
from pathlib import Path

from hydra.core.object_type import ObjectType
from hydra.core.plugins import Plugins
from hydra.plugins.config_source import ConfigLoadError, ConfigResult, ConfigSource
from omegaconf import OmegaConf

from simcore.models import MODEL_NAMES, ModelConfigError, preset_for

__all__ = ["ModelCatalogSource", "SEARCH_PATH", "register"]

#: The search-path entry every app's primary config lists (``hydra.searchpath``).
SEARCH_PATH = "catalog://simcore.models"
_GROUP = "model"


def _option(config_path: str) -> str | None:
    """The option named by ``model/<option>[.yaml]``, or None for a path outside the group."""
    if not config_path.startswith(_GROUP + "/"):
        return None
    option = config_path[len(_GROUP) + 1:]
    return option[: -len(".yaml")] if option.endswith(".yaml") else option


def _known(option: str) -> bool:
    if option.endswith(".json") or os.sep in option and Path(option).is_file():
        return Path(option).is_file()
    try:
        return preset_for(option) is not None
    except ModelConfigError:
        return True  # a refused architecture: loading it says why, in one line


class ModelCatalogSource(ConfigSource):
    """Hydra config source of the ``model`` group: one ``{name: ...}`` node per catalog entry."""

    @staticmethod
    def scheme() -> str:
        return "catalog"

    def load_config(self, config_path: str) -> ConfigResult:
        option = _option(config_path)
        if option is None or not _known(option):
            raise ConfigLoadError(f"model: unknown model {option!r}")
        return ConfigResult(config=OmegaConf.create({"name": option}), path=self.full_path(),
                            provider="simcore.models", header={"package": None})

    def available(self) -> bool:
        return True

    def is_group(self, config_path: str) -> bool:
        return config_path.rstrip("/") == _GROUP

    def is_config(self, config_path: str) -> bool:
        option = _option(config_path)
        return option is not None and _known(option)

    def list(self, config_path: str, results_filter: ObjectType | None) -> list[str]:
        if config_path.rstrip("/") != _GROUP or results_filter == ObjectType.GROUP:
            return []
        return sorted(MODEL_NAMES)


def register() -> None:
    """Make the ``catalog`` scheme known to Hydra (idempotent); the apps call it before composing."""
    plugins = Plugins.instance()
    if ModelCatalogSource.__name__ not in {c.__name__ for c in plugins.discover(ConfigSource)}:
        plugins.register(ModelCatalogSource)
