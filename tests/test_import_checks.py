"""scripts/check_layers.py and scripts/check_import_cycles.py, run on tiny packages written here.

The packages reuse module names of the real layer table (config is base, memory facade, llm.base
base while the rest of llm is backends), so the table the checks enforce is the one tested.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _package(root: Path, files: dict[str, str]) -> Path:
    """A package ``pkg`` under ``root`` with these files (relative paths → source)."""
    package = root / "pkg"
    for name, source in {"__init__.py": "", **files}.items():
        path = package / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source, encoding="utf-8")
    return package


def _run(script: str, package: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(REPO / "scripts" / script), str(package)], capture_output=True, text=True, timeout=60
    )


def test_layers_pass_when_imports_go_down_or_sideways(tmp_path):
    package = _package(
        tmp_path,
        {
            "config.py": "",
            "schema.py": "from pkg import config\n",
            "storage.py": "from pkg.schema import *\n",
            "memory.py": "import pkg.storage\nfrom . import config\n",
            "llm/__init__.py": "from pkg.llm import base\n",
            "llm/base.py": "",
            "llm/cache.py": "from pkg.llm.base import *\nfrom pkg import config\n",
        },
    )
    result = _run("check_layers.py", package)
    assert result.returncode == 0, result.stdout
    assert "every module of pkg imports only its own layer and lower ones" in result.stdout


def test_an_import_of_a_higher_layer_is_reported_wherever_it_stands(tmp_path):
    package = _package(
        tmp_path,
        {
            "config.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.memory import Memory\n",
            "schema.py": "def load():\n    from pkg import storage\n",
            "storage.py": "",
            "memory.py": "",
            # A name from the package's __init__ (the public API, facade layer).
            "files.py": "from pkg import __version__\n",
            "llm/__init__.py": "",
            "llm/base.py": "from .cache import CachedLLM\n",
            "llm/cache.py": "",
        },
    )
    result = _run("check_layers.py", package)
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        f"{package / 'config.py'}:3: config (base) imports memory (facade), a higher layer",
        f"{package / 'files.py'}:1: files (base) imports __init__ (facade), a higher layer",
        f"{package / 'llm' / 'base.py'}:1: llm.base (base) imports llm.cache (backends), a higher layer",
        f"{package / 'schema.py'}:2: schema (base) imports storage (backends), a higher layer",
    ]


def test_a_module_without_a_layer_is_reported(tmp_path):
    package = _package(tmp_path, {"config.py": "", "helpers.py": "from pkg import config\n"})
    result = _run("check_layers.py", package)
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        f"{package / 'helpers.py'}: module helpers has no layer: add it to LAYERS in check_layers.py"
    ]


def test_import_cycles_are_reported_and_an_acyclic_package_passes(tmp_path):
    acyclic = _package(tmp_path / "a", {"one.py": "from pkg import two\n", "two.py": ""})
    result = _run("check_import_cycles.py", acyclic)
    assert result.returncode == 0 and result.stdout.strip() == "no import cycle among 3 modules of pkg"

    cyclic = _package(tmp_path / "b", {"one.py": "from pkg import two\n", "two.py": "def f():\n    import pkg.one\n"})
    result = _run("check_import_cycles.py", cyclic)
    assert result.returncode == 1
    assert result.stdout.strip() == "import cycle: pkg.one -> pkg.two -> pkg.one"
