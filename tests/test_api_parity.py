"""The surfaces take the same arguments.

* ``HybridMemory`` and ``HybridMemoryClient`` both implement ``MemoryAPI``: every method of the
  protocol, with its parameters (names, kinds, defaults, annotations) in order and its return
  type; an implementation may add optional parameters after them, nothing else.
* Each MCP tool takes its HTTP route's arguments (path and query parameters, body fields) by
  name, JSON schema (type, limits) and default, except the differences listed on purpose; the
  search route takes every filter of ``HybridMemory.search``.
"""

from __future__ import annotations

import inspect
from typing import Any

import anyio
import pytest
from fastapi import FastAPI

from hybridmem_local.api import MemoryAPI
from hybridmem_local.memory import HybridMemory
from hybridmem_local.retrieval.retriever import SearchFilters
from hybridmem_local.service.client import HybridMemoryClient
from hybridmem_local.service.mcp_server import build_mcp_server
from hybridmem_local.service.operations import Operations
from hybridmem_local.service.routes import ROUTERS

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
    "backup",  # a copy of the store file: the service's database is backed up where it runs
    "claim_sessions",  # a curation worker's claim on the queue: workers run beside the store, not over HTTP
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
    "sessions",  # evaluation and the worker read the session table in process; remotely, get_session
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


# --------------------------------------------------------------------------- MCP tools and HTTP routes

NS = "/v1/namespaces/{namespace}"
#: The HTTP route (method, path) each MCP tool stands for.
ROUTE_OF_TOOL = {
    "add_session": ("post", f"{NS}/sessions"),
    "add_messages": ("post", f"{NS}/messages"),
    "session_status": ("get", f"{NS}/sessions/{{session_id}}"),
    "add_memory": ("post", f"{NS}/memories"),
    "search": ("post", f"{NS}/search"),
    "ask": ("post", f"{NS}/ask"),
    "list_memories": ("get", f"{NS}/memories"),
    "delete_memory": ("delete", f"{NS}/memories/{{memory_id}}"),
    "reset_namespace": ("delete", NS),
    "list_redactions": ("get", f"{NS}/redactions"),
    "undo_redaction": ("post", f"{NS}/redactions/{{redaction_id}}/undo"),
    "confirm_redaction": ("post", f"{NS}/redactions/{{redaction_id}}/confirm"),
}
#: Tools without a route of their own, with what HTTP does instead.
ONLY_MCP = {"remember": "POST .../messages with one message from the user"}
#: Arguments that differ from the route's on purpose, (tool, argument) → why; "*" is every tool.
DIFFERENT_ON_PURPOSE = {
    ("*", "namespace"): "optional, left out where the connection is scoped to one namespace; over HTTP in the path",
    ("list_memories", "limit"): "smaller pages (MAX_TOOL_PAGE, 50 by default): a page lands in the agent's context",
    ("delete_memory", "reason"): "its default names MCP in the memory's history",
}


def contract(schema: Any, definitions: dict[str, Any]) -> Any:
    """``schema`` with each ``$ref`` replaced by its definition, less titles and descriptions (docs,
    which may differ; a field named ``title`` stays, its schema is a dict) and null defaults
    (FastAPI's OpenAPI leaves them out; whether an argument is required is compared apart)."""
    if isinstance(schema, list):
        return [contract(item, definitions) for item in schema]
    if not isinstance(schema, dict):
        return schema
    kept = {
        key: contract(value, definitions)
        for key, value in schema.items()
        if key != "$ref"
        and not (key in ("title", "description") and isinstance(value, str))
        and not (key == "default" and value is None)
    }
    if "$ref" in schema:
        return {**contract(definitions[schema["$ref"].rsplit("/", 1)[-1]], definitions), **kept}
    return kept


def route_arguments(openapi: dict[str, Any], method: str, path: str) -> dict[str, tuple[Any, bool]]:
    """A route's path and query parameters and JSON body fields: name → (schema, required)."""
    operation = openapi["paths"][path][method]
    definitions = openapi["components"]["schemas"]
    arguments = {
        p["name"]: (contract(p["schema"], definitions), p.get("required", False))
        for p in operation.get("parameters", [])
    }
    if "requestBody" in operation:
        body = contract(operation["requestBody"]["content"]["application/json"]["schema"], definitions)
        arguments |= {name: (field, name in body.get("required", [])) for name, field in body["properties"].items()}
    return arguments


def tool_arguments(tool: Any) -> dict[str, tuple[Any, bool]]:
    """An MCP tool's arguments: name → (schema, required)."""
    schema = tool.input_schema
    definitions = schema.get("$defs", {})
    return {
        name: (contract(field, definitions), name in schema.get("required", []))
        for name, field in schema["properties"].items()
    }


@pytest.fixture(scope="module")
def openapi() -> dict[str, Any]:
    app = FastAPI()
    for router in ROUTERS:
        app.include_router(router)
    return app.openapi()


@pytest.fixture(scope="module")
def tools() -> dict[str, Any]:
    # Listing the tools touches neither the operations' state nor the caller's scope.
    server = build_mcp_server(Operations(state=None), lambda ctx: None)
    return {tool.name: tool for tool in anyio.run(server.list_tools)}


def test_every_mcp_tool_has_its_http_route_or_says_why_not(tools, openapi):
    assert set(tools) == set(ROUTE_OF_TOOL) | set(ONLY_MCP)
    for method, path in ROUTE_OF_TOOL.values():
        assert method in openapi["paths"][path], (method, path)


@pytest.mark.parametrize("tool", sorted(ROUTE_OF_TOOL))
def test_each_mcp_tool_takes_its_routes_arguments(tool, tools, openapi):
    route = route_arguments(openapi, *ROUTE_OF_TOOL[tool])
    given = tool_arguments(tools[tool])
    assert sorted(given) == sorted(route), tool
    for name in sorted(given):
        if ("*", name) in DIFFERENT_ON_PURPOSE or (tool, name) in DIFFERENT_ON_PURPOSE:
            assert given[name] != route[name], f"{tool}({name}) is listed as different but is not"
        else:
            assert given[name] == route[name], f"{tool}({name})"


def test_the_search_route_takes_every_filter_of_the_facade(openapi):
    route = route_arguments(openapi, *ROUTE_OF_TOOL["search"])
    assert set(route) == set(inspect.signature(MemoryAPI.search).parameters) - {"self"}
    filters = SearchFilters.model_json_schema()
    assert {name: schema for name, (schema, _) in route.items() if name in SearchFilters.model_fields} == {
        name: contract(schema, filters.get("$defs", {})) for name, schema in filters["properties"].items()
    }
