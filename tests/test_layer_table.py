"""docs/architecture.md's "Packages and layers" table is the one scripts/check_layers.py prints
from its ``LAYERS``, so the docs cannot drift from what the checker enforces."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _docs_table() -> str:
    lines = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8").splitlines()
    section = lines[lines.index("## Packages and layers") + 1 :]
    end = next((i for i, line in enumerate(section) if line.startswith("## ")), len(section))
    return "".join(f"{line}\n" for line in section[:end] if line.startswith("|"))


def test_the_docs_layer_table_is_the_checkers():
    generated = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "check_layers.py"), "--markdown"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert generated.startswith("| layer | packages and modules | owns |\n")
    assert _docs_table() == generated, (
        "docs/architecture.md's layer table differs from LAYERS in scripts/check_layers.py: "
        "replace it with the output of `python scripts/check_layers.py --markdown`"
    )
