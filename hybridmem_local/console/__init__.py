"""The memory console: pages at ``/console`` of ``hybridmem serve`` (same process, port, keys and
scopes as the HTTP API), for a person asking *what does it know, and where did it get it?*

    app.mount("/console", console_app(app.state.operations, require_auth))   # service/app.py

Design decisions, and why:

* **Server-rendered HTML** (Jinja2 templates, plain forms, no JavaScript needed). Every page is a
  GET, every change a POST form; the server has the data, the authorization and the paging, so
  rendering there keeps one source of truth, needs no build step (no Node), and works with a
  keyboard and a screen reader out of the box. One small CSS file is served by the app itself
  (``static/console.css``): the page loads nothing from outside the machine, so the no-egress
  promise holds in the browser too.
* **Same authorization, same audit.** Pages and actions get their handle from
  ``Operations.on(Reader|Writer|Admin, KeyScope(key), namespace)`` exactly as the HTTP routes do,
  so a reader's forged POST to an edit answers 403 from the operations layer, not from a check
  the console repeats. :class:`~hybridmem_local.console.guard.ConsoleGuard` is the HTTP ``Guard``
  with a cookie instead of a bearer header: it rate-limits by key, reads the body with the same
  size limit and writes one audit entry per request, actor the key id, action
  ``<METHOD> /console/<route>`` (static files aside).
* **Sign-in keeps the key out of the browser.** The form's API key is checked once
  (``KeyRing.authenticate``); the browser then holds only a random session id (256 bits) in a
  cookie (HttpOnly, SameSite=Strict, Path=/console, Secure under HTTPS) that the server maps, in
  memory, to the key's id and a CSRF token. Neither the key nor its secret is kept: every request
  re-reads the key by its id, so a revoked key's session ends on its next request. Sessions end
  on sign-out, after ``IDLE_S`` idle, or when the process restarts (sign in again).
* **CSRF**: every POST form carries the session's token, compared in constant time (403
  otherwise); the sign-in form a double-submit token of its own cookie. SameSite=Strict is a
  second line.
* **Paging on the server**: a list shows one page (``PAGE`` rows). Memories ask the store for
  that page plus one row (``LIMIT``/``OFFSET``), search for its top ``SEARCH_K`` per store, the
  audit trail for at most a page past the offset; the session list reads the namespace's
  session records and cuts one page from them (the facade pages sessions no finer yet).
"""

from __future__ import annotations

from hybridmem_local.console.routes import console_app

__all__ = ["console_app"]
