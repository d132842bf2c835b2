"""The console in a real browser: headless Chromium (Debian's ``chromium`` package, launched by
its path through Playwright for Python; no browser is downloaded) against ``hybridmem serve``
in a process of its own on 127.0.0.1, its store filled through the hashing embedder and
add-memories, its LLM the scripted chat server.

Skipped, saying why, where Playwright or Chromium is absent (``scripts/install.sh`` installs
both). With ``HYBRIDMEM_CONSOLE_SCREENSHOTS=docs/console`` the tests also write the docs'
screenshots there.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from hybridmem_local.config import load_config
from hybridmem_local.service.state import ServiceState
from tests.console.store import SSN, fill
from tests.fake_vllm_server import ChatServer
from tests.service.live import LiveProcess, ServeProcess, free_port
from tests.service.scripted_llm import ANSWER, llm_settings, respond

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e '.[dev]')")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        CHROMIUM is None, reason="no chromium on PATH (apt-get install chromium; scripts/install.sh does)"
    ),
]
SHOTS = os.environ.get("HYBRIDMEM_CONSOLE_SCREENSHOTS")


class AuthServe(ServeProcess):
    """``hybridmem serve`` with API keys (``ServeProcess`` runs ``--no-auth``)."""

    def __init__(self, db: Path, overrides: dict, log: Path):
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        LiveProcess.__init__(self, ["serve"], db, overrides, log, ["--port", str(self.port)])


@pytest.fixture(scope="module")
def served(tmp_path_factory, hashing_embedder):
    folder = tmp_path_factory.mktemp("console-browser")
    db = folder / "memory.db"
    chat = ChatServer(respond)
    overrides = llm_settings(chat, **{"embedder.backend": "hashing"})
    state = ServiceState(db, load_config(None, overrides), embedder=hashing_embedder, start_worker=False)
    state.open()
    try:
        with state.memory() as memory:
            ids = fill(memory)
        tokens = {role: state.keys.create(["alice"], role)[1] for role in ("read", "write", "admin")}
        tokens["root"] = state.keys.create(["*"], "admin")[1]
        tokens["bob"] = state.keys.create(["bob"], "write")[1]
    finally:
        state.close()
    serve = AuthServe(db, overrides, folder / "serve.log")
    try:
        serve.wait_ready()
        yield serve.base_url, tokens, ids
    finally:
        serve.terminate()
        chat.stop()


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-dev-shm-usage"]
        )
        yield browser
        browser.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    page.set_default_timeout(30_000)
    yield page
    context.close()


def sign_in(page, base_url: str, token: str) -> None:
    page.goto(base_url + "/console/")
    sync_api.expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    page.get_by_label("API key").fill(token)
    page.get_by_role("button", name="Sign in").click()
    sync_api.expect(page.get_by_role("heading", name="Namespaces")).to_be_visible()


def shot(page, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / f"{name}.png"))


def test_sign_in_search_open_the_source_turns_edit_and_see_the_history(served, page):
    base_url, tokens, ids = served
    sign_in(page, base_url, tokens["write"])
    shot(page, "namespaces")
    page.get_by_role("link", name="alice", exact=True).click()
    sync_api.expect(page.get_by_role("heading", name="Namespace alice")).to_be_visible()
    shot(page, "namespace")
    page.get_by_role("link", name="Memories").click()
    page.get_by_label("Search (the API's search)").fill("beagle puppy Biscuit")
    page.get_by_label("Search (the API's search)").press("Enter")
    episodes = page.locator("table.hits").first
    sync_api.expect(episodes).to_contain_text("Biscuit the beagle")
    shot(page, "search")
    episodes.get_by_role("link", name=f"#{ids['biscuit']}", exact=True).click()
    sync_api.expect(page.get_by_role("heading", name=re.compile(f"Memory #{ids['biscuit']}"))).to_be_visible()
    sync_api.expect(page.locator("li.source")).to_have_count(2)  # its source turns, highlighted in their session
    sync_api.expect(page.locator("li.source").first).to_contain_text("beagle puppy")
    # The session page: the turns beside the memories curated from them.
    page.get_by_role("link", name="s1", exact=True).click()
    sync_api.expect(page.get_by_role("heading", name="Session s1")).to_be_visible()
    sync_api.expect(page.locator("li.source")).to_have_count(2)
    sync_api.expect(page.locator(".memlist")).to_contain_text("Oak Avenue")
    shot(page, "session")
    page.go_back()
    # Edit: a new version that supersedes this one, the change in its history.
    page.get_by_text("Edit", exact=True).click()
    page.get_by_label("Title").fill("Biscuit the beagle puppy")
    page.get_by_label("Reason (kept in the history)").first.fill("more precise title")
    page.get_by_role("button", name="Save as a new version").click()
    sync_api.expect(page.get_by_text(f"Supersedes #{ids['biscuit']}")).to_be_visible()
    history = page.locator("table.history")
    sync_api.expect(history).to_contain_text("update")
    sync_api.expect(history).to_contain_text("Biscuit the beagle puppy")
    shot(page, "memory")
    page.get_by_role("link", name=f"#{ids['biscuit']}", exact=True).click()
    sync_api.expect(page.locator("table.history")).to_contain_text("more precise title")
    sync_api.expect(page.get_by_text("Superseded by")).to_be_visible()


def test_a_reader_has_no_edit_button_and_a_forged_post_is_refused(served, page):
    base_url, tokens, ids = served
    sign_in(page, base_url, tokens["read"])
    page.goto(f"{base_url}/console/namespaces/alice/memories/{ids['oak']}")
    sync_api.expect(page.get_by_role("heading", name=re.compile(f"Memory #{ids['oak']}"))).to_be_visible()
    sync_api.expect(page.get_by_text("Edit", exact=True)).to_have_count(0)
    sync_api.expect(page.get_by_role("button", name="Delete memory")).to_have_count(0)
    csrf = page.locator('input[name="csrf"]').first.get_attribute("value")
    # The browser's own session cookie and a valid CSRF token: only the role is missing.
    forged = page.request.post(
        f"{base_url}/console/namespaces/alice/memories/{ids['oak']}/edit",
        form={"csrf": csrf, "reason": "forged", "object": "somewhere else"},
    )
    assert forged.status == 403 and "write role" in forged.text()
    page.reload()
    sync_api.expect(page.locator("dl.fields")).to_contain_text("a flat on Oak Avenue")


def test_an_admin_undoes_one_redaction_and_confirms_another(served, page):
    base_url, tokens, _ = served
    sign_in(page, base_url, tokens["admin"])
    page.goto(f"{base_url}/console/namespaces/alice/redactions")
    cards = page.locator("article.redaction")
    sync_api.expect(cards).to_have_count(2)
    sync_api.expect(cards.first.locator("del").first).to_have_text(SSN)  # the removed span, shown to admins
    shot(page, "redactions")
    first_heading = cards.first.get_by_role("heading").inner_text()
    cards.first.get_by_role("button", name="Undo: put the text back").click()
    undone = page.locator("article.redaction", has_text=first_heading.split(" pending")[0])
    sync_api.expect(undone.locator(".badge")).to_have_text("undone")
    page.goto(f"{base_url}/console/namespaces/alice/redactions")
    sync_api.expect(page.locator("article.redaction")).to_have_count(1)
    remaining = page.locator("article.redaction").first
    remaining.get_by_label(re.compile("Type confirm")).fill("confirm")
    remaining.get_by_role("button", name="Confirm").click()
    sync_api.expect(page.locator(".badge", has_text="confirmed")).to_have_count(1)
    page.goto(f"{base_url}/console/namespaces/alice/sessions/s2")
    sync_api.expect(page.locator("ol.turns")).to_contain_text(SSN)  # put back by the undo


def test_the_audit_chain_is_verified_and_shows_the_console_actions(served, page):
    base_url, tokens, _ = served
    sign_in(page, base_url, tokens["root"])
    page.get_by_role("link", name="Audit").click()
    writer = tokens["write"].split("_")[1]
    page.get_by_label("Key id").fill(writer)
    page.get_by_role("button", name="Filter").click()
    sync_api.expect(page.locator("table.audit")).to_contain_text(
        "POST /console/namespaces/{namespace}/memories/{memory_id}/edit"
    )
    page.get_by_role("button", name="Verify chain").click()
    sync_api.expect(page.locator("#verdict")).to_contain_text("Chain verified")
    shot(page, "audit")


def test_ask_shows_the_answer_its_context_and_citations(served, page):
    base_url, tokens, _ = served
    sign_in(page, base_url, tokens["read"])
    page.goto(f"{base_url}/console/namespaces/alice/ask")
    page.get_by_label("Question").fill("What is the name of Alice's puppy?")
    page.get_by_role("button", name=re.compile("Ask")).click()
    sync_api.expect(page.locator(".answer")).to_have_text(ANSWER)
    sync_api.expect(page.locator("pre.context")).not_to_be_empty()
    shot(page, "ask")


def test_a_key_of_another_namespace_sees_nothing_of_it(served, page):
    base_url, tokens, ids = served
    sign_in(page, base_url, tokens["bob"])
    sync_api.expect(page.locator("main table")).to_contain_text("bob")
    sync_api.expect(page.locator("main table")).not_to_contain_text("alice")
    for path in (
        "/namespaces/alice",
        "/namespaces/alice/memories?q=beagle",
        f"/namespaces/alice/memories/{ids['biscuit']}",
        "/namespaces/alice/sessions/s1",
    ):
        answer = page.goto(f"{base_url}/console{path}")
        assert answer.status == 403, path
        sync_api.expect(page.locator("main")).not_to_contain_text("Biscuit")
    answer = page.goto(f"{base_url}/console/namespaces/bob/memories/{ids['biscuit']}")
    assert answer.status == 404
    page.goto(f"{base_url}/console/namespaces/bob/memories?q=beagle+puppy+Biscuit")
    sync_api.expect(page.locator("main")).not_to_contain_text("Biscuit the beagle")
