"""Each error code means the same over HTTP, over MCP and in the client: the service's error
handlers on uvicorn, the MCP server's tool errors through the SDK's client, and
``HybridMemoryClient`` decoding the HTTP answers, all from the one table
(``hybridmem_local.errors.ERROR_CODES``).

The routes and the tool here raise each code's error on purpose (no model, no store): what is
under test is the mapping. The real routes and tools reach the codes in test_http_*.py and
test_mcp.py.
"""

from __future__ import annotations

import logging
from typing import Any

import anyio
import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import PlainTextResponse
from mcp import Client

from hybridmem_local.errors import ERROR_CODES, HybridMemError, RateLimitedError
from hybridmem_local.service.client import HybridMemoryClient
from hybridmem_local.service.errors import install_error_handlers
from hybridmem_local.service.mcp_server import CodedMCPServer
from tests.service.live import ThreadedServer

#: The namespace whose route raises an error that is not the library's own.
BUG = "bug"
INTERNAL_MESSAGE = "internal error (ValueError); see the server log"


def failure(code: str) -> Exception:
    """What a route or tool raises for ``code``; ``BUG`` a plain ValueError with a secret in it."""
    if code == BUG:
        return ValueError("secret detail")
    error = ERROR_CODES[code].error
    if error is RateLimitedError:
        return RateLimitedError(f"message for {code}", retry_after=2.0)
    return error(f"message for {code}")


def expected(code: str) -> tuple[str, str]:
    """The code and message every surface must report."""
    if code == BUG:
        return "internal", INTERNAL_MESSAGE
    if code == "internal":  # the library's own internal errors keep their text in the log too
        return "internal", "internal error (HybridMemError); see the server log"
    return code, f"message for {code}"


CASES = [*ERROR_CODES, BUG]


@pytest.fixture(scope="module")
def http_url():
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/v1/namespaces/proxy/stats")
    def proxy() -> PlainTextResponse:
        return PlainTextResponse("<html>Bad Gateway</html>", status_code=502)

    @app.get("/v1/namespaces/{namespace}/stats")
    def stats(namespace: str) -> dict:
        raise failure(namespace)

    with ThreadedServer(app) as server:
        yield server.base_url


@pytest.mark.parametrize("code", CASES)
def test_http_answers_each_code_with_its_status_and_message(http_url, code, caplog):
    with caplog.at_level(logging.ERROR, logger="hybridmem_local.service.errors"):
        response = httpx.get(f"{http_url}/v1/namespaces/{code}/stats", timeout=30)
    want_code, want_message = expected(code)
    assert response.status_code == ERROR_CODES[want_code].status
    assert response.json() == {"error": {"code": want_code, "message": want_message}}
    assert ("secret detail" in caplog.text) == (code == BUG)  # logged, never answered
    if code == "rate_limited":
        assert response.headers["Retry-After"] == "2"
    if code == "unauthorized":
        assert response.headers["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize("code", CASES)
def test_the_client_raises_the_class_the_table_names(http_url, code):
    want_code, want_message = expected(code)
    with HybridMemoryClient(http_url) as client, pytest.raises(HybridMemError) as caught:
        client.stats(code)
    assert type(caught.value) is ERROR_CODES[want_code].error
    assert (caught.value.code, caught.value.message, caught.value.status) == (
        want_code,
        want_message,
        ERROR_CODES[want_code].status,
    )
    if code == "rate_limited":
        assert caught.value.retry_after == 2.0


def test_the_client_names_an_answer_that_is_not_the_services(http_url):
    with HybridMemoryClient(http_url) as client, pytest.raises(HybridMemError) as caught:
        client.stats("proxy")  # a proxy's error page
    assert type(caught.value) is HybridMemError and caught.value.code == "internal"
    assert "HTTP 502" in caught.value.message and "Bad Gateway" in caught.value.message


def mcp_server() -> CodedMCPServer:
    server = CodedMCPServer("errors")

    @server.tool()
    def fail(code: str) -> str:
        """Raise the error of ``code``."""
        raise failure(code)

    return server


async def tool_text(arguments: dict[str, Any], tool: str = "fail") -> str:
    async with Client(mcp_server()) as client:
        result = await client.call_tool(tool, arguments)
    assert result.is_error
    return " ".join(getattr(block, "text", "") for block in result.content)


@pytest.mark.parametrize("code", CASES)
def test_mcp_tool_errors_carry_the_same_code_and_message(code, caplog):
    with caplog.at_level(logging.ERROR, logger="hybridmem_local.service.errors"):
        text = anyio.run(tool_text, {"code": code})
    want_code, want_message = expected(code)
    assert text == f"{want_code}: {want_message}"
    assert ("secret detail" in caplog.text) == (code == BUG)


def test_mcp_refusals_of_the_sdk_are_coded_too():
    assert anyio.run(tool_text, {}) == "validation_error: code: Field required"
    assert anyio.run(tool_text, {"code": "x"}, "no_such_tool") == "not_found: Unknown tool: no_such_tool"
