"""Fail (exit 1) when a module imports a module of a higher layer, or has no layer; print each.

    .venv/bin/python scripts/check_layers.py              # hybridmem_local
    .venv/bin/python scripts/check_layers.py path/to/pkg

The layers run the way data flows, lowest first: a module may import modules of its own layer
and of lower ones, never of a higher one. Every import counts, as in check_import_cycles.py
(module level, inside functions, under ``if TYPE_CHECKING``). A module no entry of
:data:`LAYERS` names is an error too, so a new module is placed on purpose.
"""

from __future__ import annotations

import sys
from pathlib import Path

from check_import_cycles import import_lines, module_names

#: Layers, lowest first, each with the modules it holds: names relative to the package, each
#: covering its submodules ("llm" covers "llm.cache"); the longest entry that covers a module
#: decides its layer ("llm.base" is base, the rest of "llm" backends). "__init__" is the
#: package's own ``__init__``, the public API.
LAYERS: list[tuple[str, list[str]]] = [
    # Data model, settings, files and model files; the LLM protocol, the prompts and the text
    # analysis (stems, alignment) are data and pure functions too; the error tree every layer raises.
    ("base", ["errors", "config", "schema", "usage", "files", "models", "llm.base", "prompts", "text"]),
    # What holds or computes: the SQLite store, the embedder, the LLM backends.
    ("backends", ["storage", "embedding", "llm"]),
    ("indexes", ["indexes"]),
    ("stages", ["curation", "retrieval", "consolidation"]),
    # Answering renders what retrieval returns (its context uses retrieval's RRF).
    ("answering", ["answering"]),
    ("facade", ["memory", "api", "__init__"]),
    ("surfaces", ["service", "eval"]),
    ("commands", ["cli"]),
]


def layer_of(module: str, layers: list[tuple[str, list[str]]]) -> int | None:
    """The rank (index in ``layers``) of a package-relative module name, None when no entry covers it."""
    best: tuple[int, int] | None = None  # (length of the covering entry, rank)
    for rank, (_, entries) in enumerate(layers):
        for entry in entries:
            if (module == entry or module.startswith(entry + ".")) and (best is None or len(entry) > best[0]):
                best = (len(entry), rank)
    return None if best is None else best[1]


def problems(package_dir: Path, layers: list[tuple[str, list[str]]]) -> list[str]:
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
                    f"{path}:{line}: {relative(module)} ({layers[rank][0]}) imports "
                    f"{relative(imported)} ({layers[imported_rank][0]}), a higher layer"
                )
    return found


def main(argv: list[str]) -> int:
    package_dir = Path(argv[0]) if argv else Path(__file__).resolve().parent.parent / "hybridmem_local"
    found = problems(package_dir, LAYERS)
    for problem in found:
        print(problem)
    if found:
        return 1
    print(f"every module of {package_dir.name} imports only its own layer and lower ones ({len(LAYERS)} layers)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
