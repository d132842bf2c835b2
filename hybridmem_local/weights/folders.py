"""Where model folders live, and how a new one moves into place.

A model name is looked up as ``<models dir>/<name>/`` in :func:`models_search_path`:
``$HYBRIDMEM_MODELS_DIR`` (or ``--models-dir``) alone when set; else ``./models`` of the current
directory (a checkout, where ``scripts/install.sh`` put the models before) when it holds
``<name>/``, then the per-user directory (:func:`user_models_dir`, e.g.
``~/.local/share/hybridmem/models``), so an installed package finds its models from any
directory. An install (download, chunk wheels, conversion) writes where that lookup reads: over
the copy the lookup finds, else into the per-user directory (:func:`models_dir_for`); a new
folder is built in a staging folder beside it and renamed into place once verified.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

MODELS_DIR_ENV = "HYBRIDMEM_MODELS_DIR"


def user_models_dir() -> Path:
    """The per-user models directory, by platform convention: ``$XDG_DATA_HOME/hybridmem/models``
    (``~/.local/share/hybridmem/models`` when unset), ``~/Library/Application Support/hybridmem/
    models`` on macOS, ``%LOCALAPPDATA%\\hybridmem\\models`` on Windows."""
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Application Support"
    else:
        xdg_data_home = os.environ.get("XDG_DATA_HOME", "")
        # the XDG spec: a relative value is invalid and is ignored
        base = Path(xdg_data_home) if os.path.isabs(xdg_data_home) else Path.home() / ".local" / "share"
    return base / "hybridmem" / "models"


def configured_models_dir() -> Path | None:
    """``$HYBRIDMEM_MODELS_DIR`` (absolute), None when unset or empty."""
    configured = os.environ.get(MODELS_DIR_ENV)
    return Path(configured).expanduser().absolute() if configured else None


def models_search_path() -> list[Path]:
    """The folders ``<name>/`` is looked for in, in order: ``$HYBRIDMEM_MODELS_DIR`` alone when
    set, else ``./models`` of the current directory, then :func:`user_models_dir`."""
    configured = configured_models_dir()
    return [configured] if configured else [Path.cwd() / "models", user_models_dir()]


def default_models_dir() -> Path:
    """Where installs go unless a model is already in a checkout's ``./models``:
    ``$HYBRIDMEM_MODELS_DIR``, else :func:`user_models_dir`."""
    return models_search_path()[-1]


def models_dir_for(name: str, models_dir: Path | None = None) -> Path:
    """The models dir model ``name`` is installed into: ``models_dir`` when given, else the first
    folder of :func:`models_search_path` that holds ``<name>/`` (so an install replaces the copy
    the lookup finds rather than adding one it would never read), else :func:`default_models_dir`."""
    if models_dir is not None:
        return Path(models_dir).absolute()
    search_path = models_search_path()
    return next((base for base in search_path if (base / name).is_dir()), search_path[-1])


@contextmanager
def staging_folder(models_dir: Path, kind: str, name: str) -> Iterator[Path]:
    """A fresh ``<models dir>/.<kind>-<name>/`` to build a model folder in; removed afterwards
    whatever happens, so a failed build never leaves a half-made folder where models resolve."""
    folder = models_dir / f".{kind}-{name}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def move_into_place(staging: Path, destination: Path) -> None:
    """Replace ``destination`` (a model folder, when there is one) with the verified ``staging`` folder."""
    if destination.exists():
        shutil.rmtree(destination)
    staging.rename(destination)
