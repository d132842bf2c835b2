"""Every error the service answers with: ``{"error": {"code": ..., "message": ...}}``.

The ``code`` is stable (clients branch on it); the message names what is wrong (the field, the
namespace, the limit) so a person can fix the request. Library exceptions map to codes here, in
one place, so each route only says what it does.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from hybridmem_local.llm.base import LLMError
from hybridmem_local.model_registry import ModelRegistryError
from hybridmem_local.store import DuplicateSessionError, NotFoundError

log = logging.getLogger(__name__)

#: code → HTTP status, the documented contract (README / docs/deployment.md).
ERROR_CODES: dict[str, int] = {
    "bad_request": 400,
    "unauthorized": 401,
    "forbidden": 403,
    "not_found": 404,
    "method_not_allowed": 405,
    "conflict": 409,
    "payload_too_large": 413,
    "unsupported_media_type": 415,
    "validation_error": 422,
    "rate_limited": 429,
    "internal": 500,
    "queue_full": 503,
    "not_ready": 503,
    "timeout": 504,
}


class ErrorBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    code: str
    message: str


class ErrorResponse(BaseModel):
    """The body of every non-2xx answer."""

    model_config = ConfigDict(extra="forbid")

    error: ErrorBody


class ServiceError(Exception):
    """An error with its stable code; raised by routes and middleware, answered by :func:`error_response`."""

    def __init__(self, code: str, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.code = code
        self.status = ERROR_CODES[code]
        self.message = message
        self.headers = headers or {}


def error_response(code: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    body = ErrorResponse(error=ErrorBody(code=code, message=message))
    return JSONResponse(body.model_dump(), status_code=ERROR_CODES[code], headers=headers)


def describe_validation_errors(errors: list[Any], prefix_from: int = 0) -> str:
    """``body.turns.0.text: Field required; query.limit: ...`` (at most five, each naming its field)."""
    parts = []
    for error in errors[:5]:
        location = ".".join(str(p) for p in error.get("loc", ())[prefix_from:]) or "body"
        parts.append(f"{location}: {error.get('msg', 'invalid')}")
    more = len(errors) - 5
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


#: Documented error answers for the OpenAPI schema of every route.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": ", ".join(c for c, s in ERROR_CODES.items() if s == status)}
    for status in (400, 401, 403, 404, 409, 413, 415, 422, 429, 503, 504)
}


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ServiceError)
    async def _service_error(request: Request, exc: ServiceError) -> JSONResponse:
        return error_response(exc.code, exc.message, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _request_invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = list(exc.errors())
        if any(tuple(e.get("loc", ())) == ("body",) and isinstance(e.get("input"), bytes) for e in errors):
            # FastAPI parses a body as JSON only when it says so; anything else arrives as raw bytes.
            return error_response(
                "unsupported_media_type",
                f"request body must be JSON sent with Content-Type: application/json "
                f"(got {request.headers.get('content-type') or 'no Content-Type'})",
            )
        if any(e.get("type") == "json_invalid" for e in errors):
            detail = next(e for e in errors if e.get("type") == "json_invalid").get("ctx", {}).get("error", "")
            return error_response("bad_request", f"request body is not valid JSON: {detail}".rstrip(": "))
        return error_response("validation_error", describe_validation_errors(errors))

    @app.exception_handler(ValidationError)
    async def _model_invalid(request: Request, exc: ValidationError) -> JSONResponse:
        # A library model built inside a route (e.g. a Session from its body) refused the data.
        return error_response("validation_error", describe_validation_errors(exc.errors()))

    @app.exception_handler(NotFoundError)
    async def _not_found(request: Request, exc: NotFoundError) -> JSONResponse:
        return error_response("not_found", str(exc.args[0]) if exc.args else "not found")

    @app.exception_handler(DuplicateSessionError)
    async def _duplicate(request: Request, exc: DuplicateSessionError) -> JSONResponse:
        return error_response("conflict", str(exc))

    @app.exception_handler(LLMError)
    @app.exception_handler(ModelRegistryError)
    async def _llm_unavailable(request: Request, exc: Exception) -> JSONResponse:
        # The model file is missing or its server unreachable: the service is up but cannot answer.
        log.error("LLM unavailable on %s %s: %s", request.method, request.url.path, exc)
        return error_response("not_ready", f"the LLM is not available: {exc}")

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            return error_response("not_found", f"no route {request.method} {request.url.path}")
        if exc.status_code == 405:
            return error_response("method_not_allowed", f"{request.method} is not allowed on {request.url.path}")
        if exc.status_code == 400:
            return error_response("bad_request", str(exc.detail))
        log.error("unexpected HTTP error %s: %s", exc.status_code, exc.detail)
        return error_response("internal", f"unexpected HTTP error {exc.status_code}")

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        log.exception("internal error on %s %s", request.method, request.url.path)
        return error_response("internal", f"internal error ({type(exc).__name__}); see the server log")
