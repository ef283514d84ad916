"""Reading back the pickles this project writes while constructing nothing else.

``pickle.load`` calls whatever a file names, so a crafted checkpoint could run ``os.system``. The
files this project pickles (search checkpoints, :mod:`planner.checkpoint`; the serving search's
journal, :mod:`planner.serving.journal`) are read with :func:`load` instead: every global a pickle
refers to (a class, or one of the functions numpy's pickles rebuild arrays with) must be on the
allow-list the reader passes, or the load stops with :class:`RefusedPickle` naming it, before its
module is even imported.

An allow-list is :data:`DATA` (plain Python types, numpy arrays, scalars, dtypes and random
generators), :data:`OMEGACONF` where a file holds composed config nodes, and the project's own
classes the file's writer saves, listed beside the writer. Every callable on a list is harmless
whatever arguments a file hands it (a constructor, numpy's array rebuilders): never ``getattr``,
``eval``, ``__import__``, ``copyreg`` or a function that touches files. The config schemas a
composed config node refers to change with every new option, so they are allowed by a rule instead
of by name (:func:`is_config_schema`: a dataclass of this project named ``*Config``, from a module
this process has already imported); their constructors only check their fields. No file here holds a
torch tensor; one that must would be read with ``torch.load(..., weights_only=True)``, torch's own
restricted loader.
"""

from __future__ import annotations

import dataclasses
import pickle
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import BinaryIO

__all__ = ["DATA", "OMEGACONF", "RefusedPickle", "UnreadablePickle", "SafeUnpickler", "is_config_schema", "load"]

_PROJECT_PACKAGES = ("simcore", "planner", "topologies", "validation")

#: Plain data: Python's value types and containers, numpy arrays, scalars and dtypes (``numpy._core``
#: as numpy 2 writes them, ``numpy.core`` as numpy 1 did) and numpy random generators with their state.
DATA = frozenset({
    "builtins.bool", "builtins.int", "builtins.float", "builtins.complex", "builtins.str", "builtins.bytes",
    "builtins.bytearray", "builtins.tuple", "builtins.list", "builtins.dict", "builtins.set", "builtins.frozenset",
    "collections.OrderedDict", "collections.defaultdict",
    "numpy.dtype", "numpy.ndarray",
    "numpy._core.multiarray._reconstruct", "numpy._core.multiarray.scalar", "numpy._core.numeric._frombuffer",
    "numpy.core.multiarray._reconstruct", "numpy.core.multiarray.scalar", "numpy.core.numeric._frombuffer",
    "numpy.random._pickle.__generator_ctor", "numpy.random._pickle.__bit_generator_ctor",
    "numpy.random._pcg64.PCG64", "numpy.random.bit_generator.SeedSequence",
    "numpy.random.bit_generator.__pyx_unpickle_SeedSequence",
})

#: omegaconf's config nodes (a composed ``cfg.planner`` held by a planner carries its parents, the
#: whole composed config) and the ``typing`` names their metadata records; the project's schema
#: dataclasses they refer to are listed by the file's writer.
OMEGACONF = frozenset({
    "omegaconf.dictconfig.DictConfig", "omegaconf.listconfig.ListConfig",
    "omegaconf.base.Metadata", "omegaconf.base.ContainerMetadata",
    "omegaconf.nodes.AnyNode", "omegaconf.nodes.StringNode", "omegaconf.nodes.IntegerNode",
    "omegaconf.nodes.FloatNode", "omegaconf.nodes.BooleanNode",
    "typing.Any", "typing.Dict", "typing.List",
})


def is_config_schema(module: str, name: str) -> bool:
    """Whether ``module.name`` is one of this project's config schemas: a dataclass named ``*Config``
    defined there, in a module of ``simcore``, ``planner``, ``topologies`` or ``validation`` that is
    already imported (nothing a file names is imported to answer)."""
    if module.split(".")[0] not in _PROJECT_PACKAGES or not name.endswith("Config") or "." in name:
        return False
    cls = getattr(sys.modules.get(module), name, None)
    return (isinstance(cls, type) and dataclasses.is_dataclass(cls) and cls.__module__ == module
            and cls.__qualname__ == name)


class RefusedPickle(pickle.UnpicklingError):
    """A pickle named a global outside the allow-list; ``name`` is its qualified name."""

    def __init__(self, name: str):
        super().__init__(f"refused to load {name} (not a class this project writes)")
        self.name = name


class UnreadablePickle(pickle.UnpicklingError):
    """A pickle that is cut short, corrupt or not a pickle at all (the message says what failed)."""


class SafeUnpickler(pickle.Unpickler):
    """An unpickler that finds only the globals in ``allowed`` (qualified names) or accepted by
    ``rule(module, name)`` and resolves the persistent ids in ``persistent`` (objects the file refers
    to instead of holding them)."""

    def __init__(self, fh: BinaryIO, allowed: Iterable[str], persistent: Mapping[str, object] | None = None,
                 rule: Callable[[str, str], bool] | None = None):
        super().__init__(fh)
        self._allowed = frozenset(allowed)
        self._persistent = dict(persistent or {})
        self._rule = rule

    def find_class(self, module: str, name: str):
        qualified = f"{module}.{name}"
        if qualified not in self._allowed and not (self._rule is not None and self._rule(module, name)):
            raise RefusedPickle(qualified)
        return super().find_class(module, name)

    def persistent_load(self, pid):
        if not isinstance(pid, str) or pid not in self._persistent:
            raise UnreadablePickle(f"it refers to {pid!r}, which this run does not provide")
        return self._persistent[pid]


def load(fh: BinaryIO, allowed: Iterable[str], persistent: Mapping[str, object] | None = None,
         rule: Callable[[str, str], bool] | None = None):
    """The next object pickled in ``fh``, built from ``allowed`` globals (or those ``rule`` accepts)
    only (module doc).

    Raises :class:`RefusedPickle` for a global outside ``allowed``, ``EOFError`` at the end of the
    file, and :class:`UnreadablePickle` for anything else that fails while reading (a record cut
    short, corrupt bytes, an allowed class handed arguments it refuses).
    """
    try:
        return SafeUnpickler(fh, allowed, persistent, rule).load()
    except (RefusedPickle, UnreadablePickle, EOFError):
        raise
    except Exception as exc:  # a file's bytes can make pickle (or an allowed constructor) raise anything
        raise UnreadablePickle(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__) from None
