"""The console's pages through FastAPI's TestClient (no browser): sign-in and its cookie, what a
key sees and may do (the operations decide: a reader's forged POST answers 403), CSRF, paging,
and every action in the audit trail like an HTTP request."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from hybridmem_local.config import load_config
from hybridmem_local.service.app import create_app
from hybridmem_local.service.state import ServiceState
from tests.console.store import SSN, fill

pytest.importorskip("jinja2")


@pytest.fixture(scope="module")
def service(tmp_path_factory, hashing_embedder):
    db = tmp_path_factory.mktemp("console") / "memory.db"
    config = load_config(
        None,
        {"consolidation.every_n_sessions": 0, "service.rate_limit_per_s": 1000.0, "service.rate_limit_burst": 1000},
    )
    state = ServiceState(db, config, embedder=hashing_embedder, start_worker=False)
    state.open()
    with state.memory() as memory:
        ids = fill(memory, bulk=120)
    tokens = {role: state.keys.create(["alice"], role)[1] for role in ("read", "write", "admin")}
    tokens["root"] = state.keys.create(["*"], "admin")[1]
    tokens["bob"] = state.keys.create(["bob"], "admin")[1]
    tokens["bulk"] = state.keys.create(["bulk"], "read")[1]
    app = create_app(state)
    try:
        yield state, app, tokens, ids
    finally:
        state.close()


def client(app) -> TestClient:
    return TestClient(app, follow_redirects=False)


def sign_in(app, token: str) -> TestClient:
    c = client(app)
    page = c.get("/console/sign-in")
    form_token = re.search(r'name="form_token" value="([^"]+)"', page.text).group(1)
    answer = c.post("/console/sign-in", data={"form_token": form_token, "api_key": token, "next": ""})
    assert answer.status_code == 303, answer.text
    return c


def csrf(page_text: str) -> str:
    return re.search(r'name="csrf" value="([^"]+)"', page_text).group(1)


def audit_entries(state, actor: str):
    state.flush_audit(10)
    return state.audit_entries(actor, None, None, 1000)


def test_pages_send_a_browser_without_a_session_to_sign_in(service):
    _, app, _, _ = service
    c = client(app)
    answer = c.get("/console/namespaces/alice/memories?kind=tuple")
    assert answer.status_code == 303
    assert answer.headers["location"].startswith("/console/sign-in?next=%2Fconsole%2Fnamespaces%2Falice%2Fmemories")
    assert c.post("/console/namespaces/alice/memories/1/delete", data={"reason": "x"}).status_code == 401


def test_sign_in_keeps_only_a_session_id_in_a_strict_http_only_cookie(service):
    state, app, tokens, _ = service
    c = client(app)
    page = c.get("/console/sign-in")
    form_token = re.search(r'name="form_token" value="([^"]+)"', page.text).group(1)
    # Without the sign-in form's own token (a cross-site form): refused.
    bare = client(app).post("/console/sign-in", data={"form_token": form_token, "api_key": tokens["read"]})
    assert bare.status_code == 403
    wrong = c.post("/console/sign-in", data={"form_token": form_token, "api_key": "hm_00000000_" + "x" * 43})
    assert (
        wrong.status_code == 401
        and "not valid" in wrong.text
        and "hm_console=" not in wrong.headers.get("set-cookie", "")
    )
    answer = c.post(
        "/console/sign-in", data={"form_token": form_token, "api_key": tokens["read"], "next": "https://evil.example/"}
    )
    assert answer.status_code == 303 and answer.headers["location"] == "/console/namespaces"  # no open redirect
    cookie = next(v for v in answer.headers.get_list("set-cookie") if v.startswith("hm_console="))
    assert (
        "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict") and "Path=/console" in cookie
    )
    assert tokens["read"] not in cookie and tokens["read"].split("_")[2] not in cookie
    page = c.get("/console/namespaces")
    assert page.status_code == 200 and tokens["read"] not in page.text
    assert (
        page.headers["cache-control"] == "no-store" and "default-src 'none'" in page.headers["content-security-policy"]
    )
    # Sign-out (a POST with the CSRF token) ends the session on the server, not only in the browser.
    session_cookie = c.cookies.get("hm_console")
    assert c.post("/console/sign-out", data={"csrf": csrf(page.text)}).status_code == 303
    replay = client(app)
    replay.cookies.set("hm_console", session_cookie, path="/console")
    assert replay.get("/console/namespaces").status_code == 303


def test_a_key_sees_only_its_namespaces(service):
    _, app, tokens, ids = service
    c = sign_in(app, tokens["read"])
    page = c.get("/console/namespaces").text
    assert ">alice</a>" in page and ">bob</a>" not in page and ">bulk</a>" not in page
    assert c.get("/console/namespaces/bob").status_code == 403
    assert c.get("/console/namespaces/bob/memories").status_code == 403
    # Bob's memory by its id, under a namespace the key reaches: reported missing, not shown.
    missing = c.get(f"/console/namespaces/alice/memories/{ids['bob']}")
    assert missing.status_code == 404 and "flowerpot" not in missing.text
    found = c.get("/console/namespaces/alice/memories", params={"q": "where does Bob keep his spare key"}).text
    assert "flowerpot" not in found and "Bob" not in found.replace("where does Bob keep", "")
    assert c.get("/console/namespaces/alice/sessions/b1").status_code == 404
    # The all-namespace admin sees both.
    root = sign_in(app, tokens["root"]).get("/console/namespaces").text
    assert ">alice</a>" in root and ">bob</a>" in root


def test_search_shows_scores_per_store_and_the_memory_its_source_turns(service):
    _, app, tokens, ids = service
    c = sign_in(app, tokens["read"])
    page = c.get("/console/namespaces/alice/memories", params={"q": "beagle puppy Biscuit"}).text
    assert "Episodes: 1 hits" in page and f'/memories/{ids["biscuit"]}"' in page
    assert re.search(r"<td>0\.\d{4}</td>", page)
    memory = c.get(f"/console/namespaces/alice/memories/{ids['biscuit']}").text
    assert 'id="turn-s1:0" class="source"' in memory and 'id="turn-s1:1" class="source"' in memory
    assert 'id="turn-s1:2" class=""' in memory
    assert "Edit" not in memory and "/delete" not in memory  # a reader gets no buttons
    session = c.get("/console/namespaces/alice/sessions/s1", params={"memory": ids["biscuit"]}).text
    assert 'id="turn-s1:0" class="source"' in session and "Biscuit the beagle" in session and "Oak Avenue" in session


def test_a_readers_forged_post_is_refused_by_the_operations_and_audited(service):
    state, app, tokens, ids = service
    c = sign_in(app, tokens["read"])
    page = c.get(f"/console/namespaces/alice/memories/{ids['oak']}")
    edit = c.post(
        f"/console/namespaces/alice/memories/{ids['oak']}/edit",
        data={"csrf": csrf(page.text), "reason": "forged", "object": "a house"},
    )
    delete = c.post(
        f"/console/namespaces/alice/memories/{ids['oak']}/delete", data={"csrf": csrf(page.text), "reason": "x"}
    )
    assert edit.status_code == 403 and delete.status_code == 403 and "write role" in edit.text
    assert c.get(f"/console/namespaces/alice/memories/{ids['oak']}").text.count("a flat on Oak Avenue") >= 1
    key_id = tokens["read"].split("_")[1]
    refused = [e for e in audit_entries(state, key_id) if e.action.endswith("/edit")]
    assert refused and refused[-1].outcome == "forbidden" and refused[-1].namespace == "alice"
    assert refused[-1].action == "POST /console/namespaces/{namespace}/memories/{memory_id}/edit"


def test_a_post_without_the_sessions_csrf_token_is_refused(service):
    _, app, tokens, ids = service
    c = sign_in(app, tokens["write"])
    for data in ({"reason": "no token"}, {"reason": "wrong", "csrf": "x" * 43}):
        answer = c.post(f"/console/namespaces/alice/memories/{ids['oak']}/delete", data=data)
        assert answer.status_code == 403 and "CSRF" in answer.text
    assert "active" in c.get(f"/console/namespaces/alice/memories/{ids['oak']}").text


def test_a_writer_edits_a_memory_and_its_history_shows_before_and_after(service):
    state, app, tokens, ids = service
    c = sign_in(app, tokens["write"])
    page = c.get(f"/console/namespaces/alice/memories/{ids['oak']}")
    assert 'aria-label="Edit memory"' in page.text
    answer = c.post(
        f"/console/namespaces/alice/memories/{ids['oak']}/edit",
        data={"csrf": csrf(page.text), "reason": "they moved again", "object": "a house on Elm Street"},
    )
    assert answer.status_code == 303
    new_id = int(answer.headers["location"].rsplit("/", 1)[1])
    assert new_id != ids["oak"]
    new = c.get(answer.headers["location"]).text
    # The new version's history: the update with the row before (the old object) and after.
    assert "<dd>a flat on Oak Avenue</dd>" in new and "<dd>a house on Elm Street</dd>" in new
    assert f'Supersedes <a href="/console/namespaces/alice/memories/{ids["oak"]}"' in new
    old = c.get(f"/console/namespaces/alice/memories/{ids['oak']}").text
    assert "they moved again" in old and f"memory #{new_id}" in old and "status-superseded" in old
    key_id = tokens["write"].split("_")[1]
    [edit] = [e for e in audit_entries(state, key_id) if e.action.endswith("/edit")]
    assert edit.outcome == "ok" and edit.namespace == "alice" and edit.refs, edit


def test_memories_are_paged_on_the_server(service):
    _, app, tokens, _ = service
    c = sign_in(app, tokens["bulk"])
    first = c.get("/console/namespaces/bulk/memories").text
    assert first.count("/console/namespaces/bulk/memories/") == 50
    assert "offset=50" in first and "Previous" not in first
    last = c.get("/console/namespaces/bulk/memories", params={"offset": 100}).text
    assert last.count("/console/namespaces/bulk/memories/") == 20 and "Next" not in last and "offset=50" in last
    assert c.get("/console/namespaces/bulk/memories", params={"offset": "-x"}).status_code == 422


def test_redactions_are_for_admins_and_show_the_removed_span(service):
    _, app, tokens, _ = service
    for role in ("read", "write"):
        c = sign_in(app, tokens[role])
        assert c.get("/console/namespaces/alice/redactions").status_code == 403
        assert "Forget &amp; review" not in c.get("/console/namespaces/alice").text
    admin = sign_in(app, tokens["admin"])
    page = admin.get("/console/namespaces/alice/redactions").text
    assert f"<del>{SSN}</del>" in page or SSN in re.sub(r"</?del>", "", page)
    rid = re.search(r"/redactions/(\d+)/undo", page).group(1)
    # Confirming needs the typed word.
    refused = admin.post(
        f"/console/namespaces/alice/redactions/{rid}/confirm", data={"csrf": csrf(page), "confirm_text": "yes"}
    )
    assert refused.status_code == 422


def test_the_audit_page_is_for_the_all_namespace_admin_and_verifies_the_chain(service):
    _, app, tokens, _ = service
    assert sign_in(app, tokens["admin"]).get("/console/audit").status_code == 403
    root = sign_in(app, tokens["root"])
    page = root.get("/console/audit")
    assert page.status_code == 200 and "POST /console/sign-in" in page.text
    verified = root.post("/console/audit/verify", data={"csrf": csrf(page.text)})
    assert verified.status_code == 200 and "Chain verified" in verified.text


def test_a_revoked_keys_session_ends_at_its_next_request(service):
    state, app, _, _ = service
    key, token = state.keys.create(["alice"], "read")
    c = sign_in(app, token)
    assert c.get("/console/namespaces").status_code == 200
    state.keys.revoke(key.key_id)
    assert c.get("/console/namespaces").status_code == 303


def test_the_stylesheet_is_served_by_the_app_and_pages_load_nothing_else(service):
    _, app, tokens, ids = service
    c = sign_in(app, tokens["admin"])
    assert c.get("/console/static/console.css").status_code == 200
    for path in (
        "/console/namespaces",
        "/console/namespaces/alice",
        f"/console/namespaces/alice/memories/{ids['biscuit']}",
    ):
        text = c.get(path).text
        assert re.findall(r'(?:src|href)="(https?:)?//', text) == []
        assert "<script" not in text
