"""Fail (exit 1) when a module imports a module of a higher layer, or has no layer; print each.

    .venv/bin/python scripts/check_layers.py              # hybridmem_local
    .venv/bin/python scripts/check_layers.py path/to/pkg
    .venv/bin/python scripts/check_layers.py --markdown   # the layer table of docs/architecture.md

The layers run the way data flows, lowest first: a module may import modules of its own layer
and of lower ones, never of a higher one. Every import counts, as in check_import_cycles.py
(module level, inside functions, under ``if TYPE_CHECKING``). A module no entry of
:data:`LAYERS` names is an error too, so a new module is placed on purpose. The table in
docs/architecture.md ("Packages and layers") is printed from :data:`LAYERS` by ``--markdown``;
tests/test_layer_table.py fails when the two differ.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NamedTuple

from check_import_cycles import import_lines, module_names

PACKAGE_DIR = Path(__file__).resolve().parent.parent / "hybridmem_local"


class Layer(NamedTuple):
    name: str
    #: Names relative to the package, each covering its submodules ("llm" covers "llm.cache").
    modules: list[str]
    #: What the layer owns, one line: the "owns" column of docs/architecture.md.
    owns: str


#: Layers, lowest first. The longest entry that covers a module decides its layer ("llm.base"
#: is base, the rest of "llm" backends). "__init__" is the package's own ``__init__``, the
#: public API.
LAYERS: list[Layer] = [
    Layer(
        "base",
        ["errors", "config", "schema", "results", "usage", "files", "weights", "llm.base", "prompts", "text"],
        "data and pure functions: the error tree every layer raises; config models and YAML; the data types "
        "every stage passes (`Session`, `Episode`, `SessionRecord`, ...); the public API's result types; usage "
        "counting; reading files, owner-only and crash-safe writes; model weights (manifest, lookup, installs) "
        "and offline mode; the LLM protocol; prompt templates; stems and turn alignment",
    ),
    Layer(
        "backends",
        ["storage", "embedding", "llm"],
        "what holds or computes: the SQLite store; the embedder; LLM backends and their call cache",
    ),
    Layer("indexes", ["indexes"], "rebuildable search caches of the store"),
    Layer("stages", ["curation", "retrieval", "consolidation"], "one pipeline step each"),
    Layer("answering", ["answering"], "reads what retrieval returns (its context uses retrieval's RRF)"),
    Layer(
        "facade",
        ["memory", "api", "__init__"],
        "`HybridMemory`: the stages wired together, every write in one transaction; `MemoryAPI`, the signature "
        "the surfaces share; the public API",
    ),
    Layer(
        "surfaces", ["service", "console", "eval"], "HTTP API, MCP server, worker, client; memory console; benchmarks"
    ),
    Layer("commands", ["cli"], "`hybridmem`: the Python API with flags"),
]


def layer_of(module: str, layers: list[Layer]) -> int | None:
    """The rank (index in ``layers``) of a package-relative module name, None when no entry covers it."""
    best: tuple[int, int] | None = None  # (length of the covering entry, rank)
    for rank, layer in enumerate(layers):
        for entry in layer.modules:
            if (module == entry or module.startswith(entry + ".")) and (best is None or len(entry) > best[0]):
                best = (len(entry), rank)
    return None if best is None else best[1]


def problems(package_dir: Path, layers: list[Layer]) -> list[str]:
    """One line per module without a layer and per import of a higher layer, with its file and line."""
    modules = module_names(package_dir)
    package = package_dir.name

    def relative(module: str) -> str:
        return "__init__" if module == package else module.removeprefix(package + ".")

    ranks = {module: layer_of(relative(module), layers) for module in modules}
    found = [
        f"{path}: module {relative(module)} has no layer: add it to LAYERS in {Path(__file__).name}"
        for module, path in modules.items()
        if ranks[module] is None
    ]
    for module, path in modules.items():
        rank = ranks[module]
        if rank is None:
            continue
        for imported, line in sorted(import_lines(module, path, set(modules)).items()):
            imported_rank = ranks[imported]
            if imported_rank is not None and imported_rank > rank:
                found.append(
                    f"{path}:{line}: {relative(module)} ({layers[rank].name}) imports "
                    f"{relative(imported)} ({layers[imported_rank].name}), a higher layer"
                )
    return found


def markdown_table(package_dir: Path, layers: list[Layer]) -> str:
    """The "Packages and layers" table of docs/architecture.md: one row per layer, its modules
    named as files (``config.py``, ``files/``, ``llm/base.py``) and what it owns."""

    def shown(entry: str) -> str:
        path = package_dir.joinpath(*entry.split("."))
        return f"`{entry.replace('.', '/')}/`" if path.is_dir() else f"`{entry.replace('.', '/')}.py`"

    rows = ["| layer | packages and modules | owns |", "|---|---|---|"]
    rows += [
        f"| {rank} {layer.name} | {', '.join(shown(entry) for entry in layer.modules)} | {layer.owns} |"
        for rank, layer in enumerate(layers)
    ]
    return "\n".join(rows) + "\n"


def main(argv: list[str]) -> int:
    markdown = "--markdown" in argv
    paths = [arg for arg in argv if arg != "--markdown"]
    package_dir = Path(paths[0]) if paths else PACKAGE_DIR
    if markdown:
        print(markdown_table(package_dir, LAYERS), end="")
        return 0
    found = problems(package_dir, LAYERS)
    for problem in found:
        print(problem)
    if found:
        return 1
    print(f"every module of {package_dir.name} imports only its own layer and lower ones ({len(LAYERS)} layers)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
