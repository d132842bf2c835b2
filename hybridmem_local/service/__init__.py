"""``hybridmem serve``: a long-running service over one store.

* ``state.ServiceState`` — what one server process holds: the request-side ``HybridMemory``,
  the shared embedder and LLM (serialized), the API keys and the curation worker.
* ``worker.CurationWorker`` — curates ``pending`` sessions in batches, off the request path.
* ``app.create_app`` — the HTTP API (FastAPI); ``mcp_server`` — the MCP tools.

Importing this package is cheap; FastAPI and the MCP SDK load only with ``app`` / ``mcp_server``.
"""
