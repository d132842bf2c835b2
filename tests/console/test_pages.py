"""The console's pages through FastAPI's TestClient (no browser): sign-in and its cookie, what a
key sees and may do (the operations decide: a reader's forged POST answers 403), CSRF, paging,
and every action in the audit trail like an HTTP request."""

from __future__ import annotations

import re
import uuid

import pytest
from fastapi.testclient import TestClient

from hybridmem_local.config import load_config
from hybridmem_local.service.app import create_app
from hybridmem_local.service.state import ServiceState
from tests.console.store import SSN, fill

pytest.importorskip("jinja2")


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def service(request, tmp_path_factory, hashing_embedder):
    """The service over a store filled once per module, on SQLite and on PostgreSQL (the console
    shows a PostgreSQL-backed store the same way)."""
    folder = tmp_path_factory.mktemp("console")
    db = folder / "memory.db"
    overrides: dict[str, object] = {
        "consolidation.every_n_sessions": 0,
        "service.rate_limit_per_s": 1000.0,
        "service.rate_limit_burst": 1000,
    }
    if request.param == "postgresql":
        cluster = request.getfixturevalue("postgres_cluster")
        overrides |= {
            "store.url": cluster.create_database(f"console_{uuid.uuid4().hex[:12]}"),
            "store.local_dir": str(folder),
        }
    config = load_config(None, overrides)
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
    # hm_<key id>_<secret>: the secret is URL-safe base64, so it may itself hold "_".
    assert tokens["read"] not in cookie and tokens["read"].split("_", 2)[2] not in cookie
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
    # The page's CSRF token is random base64 and may spell "Bob": look outside it.
    shown = re.sub(r'name="csrf" value="[^"]*"', "", found).replace("where does Bob keep", "")
    assert "flowerpot" not in found and "Bob" not in shown
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
    assert 'aria-label="Edit memory"' not in memory and "/delete" not in memory  # a reader gets no buttons
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
    assert last.count("/console/namespaces/bulk/memories/") == 20 and "Next →" not in last and "offset=50" in last
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


def test_an_admin_forgets_a_namespace_by_typing_its_name_and_a_reader_cannot(service):
    state, app, _, _ = service
    from tests.console.store import session

    with state.memory() as memory:
        memory.enqueue([session("gone", "g1", ["Something to forget.", "Okay."])])
    reader = state.keys.create(["gone"], "read")[1]
    admin_key, admin = state.keys.create(["gone"], "admin")
    r = sign_in(app, reader)
    page = r.get("/console/namespaces/gone")
    assert page.status_code == 200 and "/forget" not in page.text and "Forget this namespace" not in page.text
    forged = r.post("/console/namespaces/gone/forget", data={"csrf": csrf(page.text), "confirm_text": "gone"})
    assert forged.status_code == 403 and "admin role" in forged.text
    a = sign_in(app, admin)
    page = a.get("/console/namespaces/gone")
    assert 'action="/console/namespaces/gone/forget"' in page.text
    # A slip (another name, or nothing typed) forgets nothing.
    for typed in ("", "alice", "gon"):
        slip = a.post("/console/namespaces/gone/forget", data={"csrf": csrf(page.text), "confirm_text": typed})
        assert slip.status_code == 422 and "gone, to forget it" in slip.text
    with state.memory() as memory:
        assert memory.sessions("gone")
    done = a.post("/console/namespaces/gone/forget", data={"csrf": csrf(page.text), "confirm_text": "gone"})
    assert done.status_code == 303 and done.headers["location"] == "/console/namespaces?forgotten=gone"
    assert "Namespace gone forgotten" in a.get(done.headers["location"]).text
    with state.memory() as memory:
        assert "gone" not in memory.store.namespaces.names() and memory.sessions("gone") == []
    [entry] = [e for e in audit_entries(state, admin_key.key_id) if e.action.endswith("/forget") and e.outcome == "ok"]
    assert entry.namespace == "gone" and entry.action == "POST /console/namespaces/{namespace}/forget"


def test_a_writer_re_curates_a_failed_session_and_a_reader_cannot(service):
    state, app, tokens, _ = service
    from tests.console.store import session

    with state.memory() as memory:
        [record] = memory.enqueue([session("alice", "f1", ["The LLM choked on this one.", "Sorry."], day=4)])
        assert memory.mark_curation_failed([record.session], "LLM timed out") == 1
    reader = sign_in(app, tokens["read"])
    page = reader.get("/console/namespaces/alice/sessions/f1")
    assert "curation_failed" in page.text and "LLM timed out" in page.text and "/retry" not in page.text
    forged = reader.post("/console/namespaces/alice/sessions/f1/retry", data={"csrf": csrf(page.text)})
    assert forged.status_code == 403
    writer = sign_in(app, tokens["write"])
    page = writer.get("/console/namespaces/alice/sessions/f1")
    assert "Re-curate this session" in page.text
    answer = writer.post("/console/namespaces/alice/sessions/f1/retry", data={"csrf": csrf(page.text)})
    assert answer.status_code == 303 and answer.headers["location"] == "/console/namespaces/alice/sessions/f1"
    with state.memory() as memory:
        record = memory.get_session("alice", "f1")
        assert record.curation_status == "pending" and record.curation_error is None
        # The worker's queue has it again (claim_sessions is what the service's worker calls).
        assert "f1" in [s.session_id for s in memory.sessions_to_curate("alice")]
    again = writer.post("/console/namespaces/alice/sessions/f1/retry", data={"csrf": csrf(page.text)})
    assert again.status_code == 422 and "only a session whose curation failed" in again.text
    curated = writer.post("/console/namespaces/alice/sessions/s1/retry", data={"csrf": csrf(page.text)})
    assert curated.status_code == 422
    assert writer.post("/console/namespaces/alice/sessions/b1/retry", data={"csrf": csrf(page.text)}).status_code == 404


def test_consolidation_runs_are_listed_a_page_at_a_time_with_their_plan_and_undo(service):
    state, app, tokens, _ = service
    from hybridmem_local.results import ConsolidationReport, StoreReport

    with state.memory() as memory:
        ids = []
        for i in range(55):
            run_id = memory.store.runs.start("bulk", "cpu", {})
            report = ConsolidationReport(
                namespace="bulk",
                run_id=run_id,
                backend="cpu",
                stores={
                    "tuple": StoreReport(
                        memories_before=120, memories_after=119, merges=1, merged_sources=2, deletions=int(i == 54)
                    )
                },
                merged={10_000 + i: [1, 2]},
                deleted={3: "duplicate"} if i == 54 else {},
            )
            memory.store.runs.finish(run_id, "bulk", report.model_dump_json())
            ids.append(run_id)
    root = sign_in(app, tokens["root"])
    first = root.get("/console/namespaces/bulk/consolidation").text
    assert first.count("/consolidation/runs/") >= 50 and f"#{ids[-1]} plan" in first and f"#{ids[4]} plan" not in first
    cells = r"</a></th>\s*<td>[^<]+</td><td>applied</td><td>1</td><td>1</td><td>(\d+)</td>"
    newest = re.search(rf"#{ids[-1]} plan{cells}", first)
    assert newest and newest.group(1) == "117"  # 120 before, 2 merged away, 1 deleted
    assert "offset=50" in first
    second = root.get("/console/namespaces/bulk/consolidation", params={"offset": 50}).text
    assert f"#{ids[0]} plan" in second and f"#{ids[-1]} plan" not in second and "Next →" not in second
    run = root.get(f"/console/namespaces/bulk/consolidation/runs/{ids[-1]}").text
    assert f"#{10_054}" in run and "duplicate" in run and f'name="undo_run" value="{ids[-1]}"' in run
    # Another namespace's run, or one of this key's namespaces asked under another: missing.
    alice_admin = sign_in(app, tokens["admin"])
    assert alice_admin.get(f"/console/namespaces/alice/consolidation/runs/{ids[0]}").status_code == 404
    assert sign_in(app, tokens["bulk"]).get("/console/namespaces/bulk/consolidation").status_code == 403


def test_the_namespaces_page_shows_last_activity_from_one_query(service, monkeypatch):
    state, app, tokens, _ = service
    from hybridmem_local.storage.events import EventLog

    calls = []
    original = EventLog.latest
    monkeypatch.setattr(EventLog, "latest", lambda self, names: calls.append(list(names)) or original(self, names))
    page = sign_in(app, tokens["root"]).get("/console/namespaces").text
    assert len(calls) == 1 and {"alice", "bob", "bulk"} <= set(calls[0])
    row = re.search(r">alice</a></th>.*?</tr>", page, flags=re.S).group(0)
    assert re.search(r'<time datetime="\d{4}-\d\d-\d\dT', row)
    with state.memory() as memory:
        latest = memory.store.events.latest(["alice", "nobody"])
    assert set(latest) == {"alice"}


def test_the_plain_list_filters_by_date_in_the_database(service):
    state, app, tokens, _ = service
    from hybridmem_local.schema import TupleDraft
    from tests.console.store import session

    stamps = ["2022", "2023-06", "2023-06-15T10:00:00", "2023-07-01", "2024-01-02"]
    with state.memory() as memory:
        memory.enqueue([session("dated", "d1", ["x"])])
        memory.add_memories(
            "dated",
            tuples=[
                TupleDraft(entity=f"e{i}", relation="on", object=t, timestamp=t, source_turn_ids=["d1:0"])
                for i, t in enumerate(stamps)
            ],
        )
        from datetime import date

        found = memory.list("dated", since=date(2023, 6, 15), until=date(2023, 6, 15))
        assert [m.timestamp for m in found] == ["2023-06", "2023-06-15T10:00:00"]
        assert [m.timestamp for m in memory.list("dated", since=date(2023, 7, 1))] == ["2023-07-01", "2024-01-02"]
        assert [m.timestamp for m in memory.list("dated", until=date(2022, 12, 31))] == ["2022"]
    key = state.keys.create(["dated"], "read")[1]
    c = sign_in(app, key)
    page = c.get("/console/namespaces/dated/memories", params={"since": "2023-06-01", "until": "2023-12-31"}).text
    # The listed tuples by their entity (a bare "e4 " would also match a random key id shown on the page).
    assert re.findall(r"\b(e\d) · <em>on</em>", page) == ["e1", "e2", "e3"]
    assert page.count("/console/namespaces/dated/memories/") == 3
    assert c.get("/console/namespaces/dated/memories", params={"since": "June"}).status_code == 422
    bulk = sign_in(app, tokens["bulk"]).get("/console/namespaces/bulk/memories", params={"since": "2023-01-01"}).text
    assert "since=2023-01-01" in bulk and "offset=50" in bulk  # the pager keeps the filter
