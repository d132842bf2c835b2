"""``HybridMemory`` and ``HybridMemoryClient`` both implement ``MemoryAPI``: every method of the
protocol, with its parameters (names, kinds, defaults, annotations) in order and its return type;
an implementation may add optional parameters after them, nothing else."""

from __future__ import annotations

import inspect

import pytest

from hybridmem_local.api import MemoryAPI
from hybridmem_local.memory import HybridMemory
from hybridmem_local.service.client import HybridMemoryClient

#: The protocol's methods (its own members, not Protocol's machinery).
METHODS = sorted(
    name for name, value in vars(MemoryAPI).items() if inspect.isfunction(value) and not name.startswith("_")
)
#: Public methods only one side has, on purpose (each says why in its docstring).
ONLY_IN_PROCESS = {
    "add_session",  # curates at once with curation.mode sync; the client's only queues (same name, other result)
    "answer_many",
    "answer_options",
    "answer_search",
    "apply_consolidation",
    "consolidate_if_due",
    "curate_pending",
    "curate_stored",
    "export_records",
    "flush",
    "import_",
    "ingest",
    "mark_curation_failed",
    "open",
    "prepare_answer",
    "purge",
    "rebuild_indexes",
    "retry_pending_scrubs",  # the service worker's own housekeeping after a forget a reader held up
    "sessions_to_curate",
    "update",
}
ONLY_REMOTE = {"add_session"}


def annotation(parameter: inspect.Parameter | inspect.Signature) -> str:
    raw = parameter.annotation if isinstance(parameter, inspect.Parameter) else parameter.return_annotation
    return str(raw).replace("builtins.", "")  # `builtins.list` where a method named list shadows it


def public_methods(cls: type) -> set[str]:
    return {name for name, value in vars(cls).items() if not name.startswith("_") and callable(value)} | {
        name for name, value in vars(cls).items() if isinstance(value, classmethod)
    }


def test_the_protocol_lists_the_shared_surface():
    assert {"enqueue", "search", "answer", "get", "list", "delete", "add_memories", "export"} <= set(METHODS)
    assert public_methods(HybridMemory) - set(METHODS) == ONLY_IN_PROCESS
    assert public_methods(HybridMemoryClient) - set(METHODS) == ONLY_REMOTE


@pytest.mark.parametrize("implementation", [HybridMemory, HybridMemoryClient])
@pytest.mark.parametrize("method", METHODS)
def test_each_implementation_has_the_protocols_signature(implementation, method):
    expected = inspect.signature(getattr(MemoryAPI, method))
    actual = inspect.signature(getattr(implementation, method))
    assert annotation(actual) == annotation(expected), f"{implementation.__name__}.{method} returns"
    wanted = list(expected.parameters.values())
    given = list(actual.parameters.values())
    assert [(p.name, p.kind, p.default, annotation(p)) for p in given[: len(wanted)]] == [
        (p.name, p.kind, p.default, annotation(p)) for p in wanted
    ], f"{implementation.__name__}.{method}"
    extra = given[len(wanted) :]
    assert all(p.default is not inspect.Parameter.empty for p in extra), f"{implementation.__name__}.{method}"
