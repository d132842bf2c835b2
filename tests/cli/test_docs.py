"""The CLI's reference is complete (as sqlite-utils checks its own): every command of the
``hybridmem`` tree has a section in docs/cli.md with a one-line description and an example, and
every public method of ``HybridMemory`` has a command there or a stated reason for having none."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import typer
from typer.core import TyperGroup

from hybridmem_local.cli.main import app
from hybridmem_local.memory import HybridMemory

DOCS = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text(encoding="utf-8")


def command_paths(group: TyperGroup, prefix: tuple[str, ...] = ()) -> Iterator[str]:
    """``hybridmem`` command lines of every leaf command, e.g. ``redactions undo``."""
    for name, command in group.commands.items():
        if isinstance(command, TyperGroup):
            yield from command_paths(command, (*prefix, name))
        else:
            yield " ".join((*prefix, name))


ROOT = typer.main.get_command(app)
assert isinstance(ROOT, TyperGroup)
COMMANDS = sorted(command_paths(ROOT))


def sections(level: str) -> dict[str, str]:
    """Heading → the text under it, for the headings of one level (``##``, ``###``)."""
    parts = re.split(rf"^{level} (.+)$", DOCS, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def documented_commands() -> dict[str, str]:
    return {
        heading.strip("`").removeprefix("hybridmem "): text
        for heading, text in sections("###").items()
        if heading.startswith("`hybridmem ")
    }


def public_methods() -> set[str]:
    return {name for name in dir(HybridMemory) if not name.startswith("_") and callable(getattr(HybridMemory, name))}


def test_every_command_is_documented_with_a_description_and_an_example():
    documented = documented_commands()
    assert sorted(documented) == COMMANDS, "docs/cli.md: one ### `hybridmem COMMAND` section per command, no other"
    for command, text in documented.items():
        description = text.strip().split("\n\n")[0]
        assert description and not description.startswith("```"), f"{command}: no description"
        examples = re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL)
        assert any(f"hybridmem {command}" in example for example in examples), f"{command}: no example"


def test_every_public_method_has_a_command_or_a_reason():
    mapped: dict[str, list[str]] = {}
    for row in sections("##")["The Python API and its commands"].splitlines():
        cells = row.split("|")[1:-1]
        if len(cells) == 2 and "`hybridmem " in cells[1]:
            for method in re.findall(r"`(\w+)`", cells[0]):
                mapped[method] = re.findall(r"`hybridmem ([a-z][a-z -]*)`", cells[1])
    reasons: dict[str, str] = {}
    for bullet in re.findall(r"^- (.+)$", sections("##")["Methods without a command"], flags=re.MULTILINE):
        names, _, reason = bullet.partition(": ")
        for method in re.findall(r"`(\w+)`", names):
            reasons[method] = reason
    assert not mapped.keys() & reasons.keys(), "a method both has a command and is listed without one"
    assert mapped.keys() | reasons.keys() == public_methods(), "docs/cli.md: map each public method, or say why not"
    for method, commands in mapped.items():
        assert commands and set(commands) <= set(COMMANDS), f"{method}: {commands} are not commands"
    assert all(len(reason) > 20 for reason in reasons.values())
