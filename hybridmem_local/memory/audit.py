"""Every public call of ``HybridMemory`` recorded in the audit trail by construction: the class
decorator wraps each public method as the class is created, and the deliberate exemptions are
listed, each with its reason (tests/storage/test_audit.py calls each)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Concatenate, Final, ParamSpec, Protocol, TypeVar

from hybridmem_local.config import Config
from hybridmem_local.results import AddSessionResult, Answer, Event, Redaction
from hybridmem_local.schema import Episode, RelationalTuple, SearchResult, SessionRecord
from hybridmem_local.storage import audit
from hybridmem_local.storage.store import MemoryStore

_P = ParamSpec("_P")
_R = TypeVar("_R")
_C = TypeVar("_C", bound=type)

#: Public members of ``HybridMemory`` that leave no audit entry, each with its reason. Every other
#: public method is recorded (``audit_public_methods``). None of these changes the store but for
#: a worker's claim on sessions (tests/storage/test_audit.py calls each and finds every row as it
#: was, claims aside).
UNAUDITED: Final[Mapping[str, str]] = MappingProxyType(
    {
        "open": "builds the facade; what is then called on it is recorded",
        "close": "lifecycle: saves the index cache and closes the store",
        "flush": "saves the index cache, which is rebuilt from the store when lost",
        "embedder": "a property: the embedding backend",
        "llm": "a property: the LLM backend",
        "scrub_pending": "a property: whether a scrub marker file exists (the worker asks on every idle poll)",
        "answer_options": "this config's answering settings; reads nothing stored",
        "sessions_to_curate": (
            "the curation worker's poll of the queue, every service.worker_poll_s: an entry per poll would bury "
            "the trail; the curate_stored that takes the sessions records what their curation changed"
        ),
        "claim_sessions": (
            "the curation worker's claim on its batch (who curates a session until when, no content), every "
            "poll with work: the curate_stored that follows records what the batch changed"
        ),
    }
)
#: The attribute by which a wrapped method names its audit action (``audited_action``).
_AUDITED_AS = "hybridmem_audit_action"


class Audited(Protocol):
    """What the wrapper reads of the object whose method it records."""

    config: Config
    store: MemoryStore


_A = TypeVar("_A", bound=Audited)


def audited_action(member: object) -> str | None:
    """The audit action a member of ``HybridMemory`` records (``HybridMemory.<name>``), None if unaudited."""
    action = getattr(member, _AUDITED_AS, None)
    return action if isinstance(action, str) else None


def audit_public_methods(cls: _C) -> _C:
    """Wrap every public method of ``cls`` in ``_audited`` as the class is created, so a method
    added later is recorded without anyone remembering to. A public member that is not a plain
    method (a property, a classmethod) must be listed in ``UNAUDITED``, as must every exemption."""
    members = vars(cls)
    unknown = sorted(UNAUDITED.keys() - members.keys())
    if unknown:
        raise TypeError(f"UNAUDITED names members {cls.__name__} does not have: {unknown}")
    for name, member in list(members.items()):
        if name.startswith("_") or name in UNAUDITED:
            continue
        if not inspect.isfunction(member):
            raise TypeError(f"{cls.__name__}.{name} is public but no method to audit: list it in UNAUDITED, with why")
        setattr(cls, name, _audited(member))
    return cls


def _audited(method: Callable[Concatenate[_A, _P], _R]) -> Callable[Concatenate[_A, _P], _R]:
    """Record each call in the audit trail (``storage/audit.py``, ``audit.enabled``): one entry
    ``HybridMemory.<name>`` per namespace, naming the ids the call returned (memories read,
    windows, sessions, redactions, an answer's context) and changed (its events). A call made
    inside another operation (a nested facade call, or a service request naming its key and
    route) adds to that operation's entry instead of writing its own; only the outermost facade
    call reports ids of its result, so an answer records the context it showed, not every
    candidate retrieved."""
    action = f"HybridMemory.{method.__name__}"
    parameters = list(inspect.signature(method).parameters.values())
    position = next((i for i, p in enumerate(parameters) if p.name == "namespace"), None)
    default = parameters[position].default if position is not None else None

    def namespace_of(args: tuple, kwargs: dict) -> str | None:
        if position is None:
            return None
        value = (
            kwargs["namespace"] if "namespace" in kwargs else args[position - 1] if len(args) >= position else default
        )
        return value if isinstance(value, str) else None

    @functools.wraps(method)
    def recorded(self: _A, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        if not self.config.audit.enabled:
            return method(self, *args, **kwargs)
        with audit.operation(action, self.store.audit.record) as scope:
            scope.depth += 1
            try:
                outermost = scope.depth == 1
                namespace = namespace_of(args, kwargs)
                if outermost and namespace is not None:
                    scope.note(namespace)
                result = method(self, *args, **kwargs)
                if outermost:
                    _note_result(scope, namespace, result)
                return result
            finally:
                scope.depth -= 1

    setattr(recorded, _AUDITED_AS, action)
    return recorded


def _note_result(scope: audit.AuditScope, namespace: str | None, result: Any) -> None:
    """The ids a call hands back (never its text): memories, windows, sessions, redactions, an answer's context."""
    for item in result if isinstance(result, list) else [result]:
        if isinstance(item, SearchResult):
            scope.note(
                item.namespace,
                read=[h.memory.stored_id for h in [*item.episodes, *item.tuples]],
                windows=[h.window.id for h in item.windows],
            )
        elif isinstance(item, (Episode, RelationalTuple)):
            scope.note(item.namespace, read=[item.stored_id])
        elif isinstance(item, Event) and item.memory_id is not None:
            scope.note(item.namespace, read=[item.memory_id])
        elif isinstance(item, SessionRecord):
            scope.note(item.session.namespace, sessions=[item.session.session_id])
        elif isinstance(item, AddSessionResult):
            scope.note(item.session.session.namespace, sessions=[item.session.session.session_id])
        elif isinstance(item, Answer):
            scope.note(namespace, context=item.context_memory_ids, cited=item.cited_memory_ids)
        elif isinstance(item, Redaction):
            scope.note(item.namespace, redactions=[item.id])
