"""How the HTTP API answers an error: ``{"error": {"code": ..., "message": ...}}`` with its status.

The code and the status come from the library's one table (``hybridmem_local.errors.ERROR_CODES``),
so a route only raises what went wrong (``NotFoundError``, ``ForbiddenError``...) and the answer
follows. Only the library's own errors carry their code and message out; anything else, and any
error whose code is ``internal``, is logged with its traceback and answered ``internal`` without
its text.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from hybridmem_local.errors import (
    ERROR_CODES,
    BadRequestError,
    HybridMemError,
    InvalidInputError,
    MethodNotAllowedError,
    NotFoundError,
    RateLimitedError,
    UnauthorizedError,
    UnsupportedMediaTypeError,
)
from hybridmem_local.service.limits import retry_after_header
from hybridmem_local.service.schemas import ErrorBody, ErrorResponse, describe_validation_errors
from hybridmem_local.storage import audit

log = logging.getLogger(__name__)


def error_response(error: HybridMemError) -> JSONResponse:
    """The answer for one of the library's errors (``internal`` ones should go through :func:`internal_error`)."""
    audit.note_outcome(error.code)  # the request's audit entry keeps the code, not only the status
    body = ErrorResponse(error=ErrorBody(code=error.code, message=error.message))
    headers: dict[str, str] = {}
    if isinstance(error, RateLimitedError) and error.retry_after is not None:
        headers["Retry-After"] = retry_after_header(error.retry_after)
    if isinstance(error, UnauthorizedError):
        headers["WWW-Authenticate"] = 'Bearer realm="hybridmem"'
    return JSONResponse(body.model_dump(), status_code=error.status, headers=headers)


def internal_error(exc: BaseException, where: str) -> HybridMemError:
    """Log ``exc`` with its traceback; the error to answer instead, which does not repeat its text."""
    log.error("internal error on %s", where, exc_info=exc)
    return HybridMemError(f"internal error ({type(exc).__name__}); see the server log")


#: Documented error answers for the OpenAPI schema of every route.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": ", ".join(c for c, e in ERROR_CODES.items() if e.status == status)}
    for status in (400, 401, 403, 404, 409, 413, 415, 422, 429, 503, 504)
}


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(HybridMemError)
    async def _library_error(request: Request, exc: HybridMemError) -> JSONResponse:
        if exc.code == "internal":
            return error_response(internal_error(exc, f"{request.method} {request.url.path}"))
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _request_invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(_request_error(request, list(exc.errors())))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        where = f"{request.method} {request.url.path}"
        if exc.status_code == 404:
            return error_response(NotFoundError(f"no route {where}"))
        if exc.status_code == 405:
            return error_response(MethodNotAllowedError(f"{request.method} is not allowed on {request.url.path}"))
        if exc.status_code == 400:
            return error_response(BadRequestError(str(exc.detail)))
        return error_response(internal_error(exc, where))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        return error_response(internal_error(exc, f"{request.method} {request.url.path}"))


def _request_error(request: Request, errors: list[Any]) -> HybridMemError:
    """What is wrong with a request FastAPI could not parse into a route's arguments."""
    if any(tuple(e.get("loc", ())) == ("body",) and isinstance(e.get("input"), bytes) for e in errors):
        # FastAPI parses a body as JSON only when it says so; anything else arrives as raw bytes.
        return UnsupportedMediaTypeError(
            f"request body must be JSON sent with Content-Type: application/json "
            f"(got {request.headers.get('content-type') or 'no Content-Type'})"
        )
    if any(e.get("type") == "json_invalid" for e in errors):
        detail = next(e for e in errors if e.get("type") == "json_invalid").get("ctx", {}).get("error", "")
        return BadRequestError(f"request body is not valid JSON: {detail}".rstrip(": "))
    return InvalidInputError(describe_validation_errors(errors))
