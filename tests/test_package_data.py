"""What the package reads at run time ships in its wheel, so a non-editable ``pip install .`` runs
``hybridmem demo`` from any directory: every data file under ``hybridmem_local/`` matches a
package-data pattern of pyproject.toml. (configs/*.yaml are examples, not read at run time:
the defaults are the code's, ``config.py``.)"""

from __future__ import annotations

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "hybridmem_local"


def _package_data() -> set[Path]:
    """The files setuptools adds to the wheel beside the modules (it globs each pattern the same way)."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = pyproject["tool"]["setuptools"]["package-data"]["hybridmem_local"]
    return {path for pattern in patterns for path in PACKAGE.glob(pattern) if path.is_file()}


def test_every_data_file_of_the_package_is_package_data():
    data_files = {
        path
        for path in PACKAGE.rglob("*")
        if path.is_file() and path.suffix not in {".py", ".pyc"} and "__pycache__" not in path.parts
    }
    assert data_files, "no data file found: is PACKAGE the package folder?"
    assert sorted(map(str, data_files - _package_data())) == []


def test_the_files_read_at_run_time_are_inside_the_package_and_shipped():
    from hybridmem_local.curation.redaction import RULES_PATH
    from hybridmem_local.prompts import PROMPTS_DIR
    from hybridmem_local.weights.manifest import SHIPPED_MANIFEST

    read = {RULES_PATH, SHIPPED_MANIFEST, *PROMPTS_DIR.glob("*.yaml"), PACKAGE / "examples" / "demo_sessions.jsonl"}
    assert all(path.is_file() and not path.is_symlink() for path in read)
    assert read <= _package_data()
