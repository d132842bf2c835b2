"""``hybridmem serve``: a long-running service over one store.

* ``state.ServiceState`` — what one server process holds: the request-side ``HybridMemory``,
  the shared embedder and LLM (serialized), the API keys and the curation worker.
* ``worker.CurationWorker`` — curates ``pending`` sessions in batches, off the request path.
* ``operations.Operations`` — what the HTTP routes and the MCP tools do, once: scope and
  ownership checks, paging and limits, over ``HybridMemory``.
* ``app.create_app`` — the HTTP API (FastAPI: the Guard, and the routers of ``routes``);
  ``mcp_server`` — the MCP tools; ``errors`` — every error answer by its stable code.
* ``schemas`` — the limits, argument types and bodies the routes, the tools and the client
  (``client.HybridMemoryClient``) share, declared once.

Importing this package is cheap; FastAPI and the MCP SDK load only with ``app`` / ``mcp_server``.
"""
