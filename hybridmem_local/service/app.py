"""The HTTP API of ``hybridmem serve``: the routes (``routes.py``) over the operations
(``operations.py``), behind the Guard.

    app = create_app(state)            # state = ServiceState(db, config); state.open()
    uvicorn.run(app, host="127.0.0.1", port=8420)

Every ``/v1`` request passes :class:`Guard` first, in this order: body size by Content-Length
(413), the bearer key (401), the key's rate limit (429), the body read with the same size limit
(413) and checked to be UTF-8 (400). Routes then check the namespace name (422) and that the
key reaches it with the route's role (403), parse the body into the library's models (422
naming the field) and call the operations, which use ``HybridMemory`` under the state's lock.
Curation never runs here: adding a session stores its raw turns and answers 202; the worker
curates it later.
"""

from __future__ import annotations

from fastapi import FastAPI

from hybridmem_local import __version__
from hybridmem_local.service.errors import ERROR_RESPONSES, install_error_handlers
from hybridmem_local.service.guard import NO_AUTH_KEY, Guard
from hybridmem_local.service.operations import Operations
from hybridmem_local.service.routes import ROUTERS
from hybridmem_local.service.state import ServiceState

__all__ = ["NO_AUTH_KEY", "Guard", "create_app"]


# --------------------------------------------------------------------------- the app


def create_app(state: ServiceState, *, require_auth: bool = True) -> FastAPI:
    """The FastAPI app over an opened ``state``; ``require_auth=False`` is ``--no-auth`` (loopback only)."""
    app = FastAPI(
        title="hybridmem-local",
        version=__version__,
        description="Offline long-term memory for dialogue agents: sessions in, curated memories, "
        "search and answers out. Every /v1 route needs `Authorization: Bearer <key>` (see `hybridmem keys create`).",
        responses=ERROR_RESPONSES,
        # The interactive docs pages load their scripts from a CDN; an offline service serves the schema only.
        docs_url=None,
        redoc_url=None,
    )
    install_error_handlers(app)
    app.state.operations = Operations(state)
    for router in ROUTERS:
        app.include_router(router)

    from hybridmem_local.service.mcp_server import mount_mcp

    mount_mcp(app, app.state.operations, require_auth=require_auth)
    from hybridmem_local.console import console_app

    app.mount("/console", console_app(app.state.operations, require_auth))  # the memory console (pages)
    app.add_middleware(Guard, state=state, require_auth=require_auth)
    return app
