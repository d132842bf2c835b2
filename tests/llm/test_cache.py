"""The on-disk LLM call cache over the real tiny transformers backend: hits cost no model call,
a run killed with SIGKILL resumes where it stopped with identical results, forget drops a tag."""

from __future__ import annotations

import signal
import sqlite3
import stat
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

import pytest
from pydantic import BaseModel, Field

from hybridmem_local.llm import CachedLLM, ChatMessage, LLMRequest, LLMResult, build_llm, sampling_settings
from tests.sqlite_locks import open_while_write_locked
from tests.tiny_model import build_tiny_model, tiny_llm_config, tiny_transformers_llm

REPO = Path(__file__).resolve().parents[2]


class Note(BaseModel):
    title: str = Field(max_length=6)
    done: bool


class CountingLLM:
    """Passes requests through to a real backend and counts them."""

    def __init__(self, inner):
        self.inner = inner
        self.model_id = inner.model_id
        self.requests: list[LLMRequest] = []

    def generate(self, requests: Sequence[LLMRequest]) -> list[LLMResult]:
        self.requests.extend(requests)
        return self.inner.generate(requests)

    def count_tokens(self, text: str) -> int:
        return self.inner.count_tokens(text)


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def tiny_llm(tiny_folder):
    return tiny_transformers_llm(tiny_folder, max_new_tokens=40, max_retries=0)


def batch(n: int, tag: str | None = None) -> list[LLMRequest]:
    return [
        LLMRequest(
            messages=[ChatMessage(role="user", content=f"session {i}")],
            output_schema=Note,
            prompt_version="curation/v1",
            tag=tag,
        )
        for i in range(n)
    ]


def cached(inner, path: Path, **kwargs) -> CachedLLM:
    return CachedLLM(inner, path, settings=sampling_settings(tiny_llm_config(max_new_tokens=40)), **kwargs)


def test_second_run_makes_no_model_calls(tiny_llm, tmp_path):
    requests = batch(3)
    counting = CountingLLM(tiny_llm)
    with cached(counting, tmp_path / "cache.sqlite") as llm:
        first = llm.generate(requests)
        assert len(counting.requests) == 3 and not any(r.cached for r in first)
        second = llm.generate(requests)
    assert len(counting.requests) == 3
    assert all(r.cached for r in second)
    assert [(r.text, r.parsed, r.prompt_tokens, r.completion_tokens) for r in second] == [
        (r.text, r.parsed, r.prompt_tokens, r.completion_tokens) for r in first
    ]
    # A new process sees the same entries.
    with cached(CountingLLM(tiny_llm), tmp_path / "cache.sqlite") as reopened:
        assert all(r.cached for r in reopened.generate(requests))


def test_key_covers_everything_that_changes_the_reply(tiny_llm, tmp_path):
    with cached(tiny_llm, tmp_path / "cache.sqlite") as llm:
        base = batch(1)[0]
        variants = [
            base,
            base.model_copy(update={"prompt_version": "curation/v2"}),
            base.model_copy(update={"max_new_tokens": 20}),
            base.model_copy(update={"enable_thinking": True}),
            base.model_copy(update={"output_schema": None}),
            base.model_copy(update={"tag": "alice"}),
            base.model_copy(update={"messages": [ChatMessage(role="user", content="session 1")]}),
        ]
        keys = {llm.key(v) for v in variants}
        assert len(keys) == len(variants)
        other_settings = CachedLLM(tiny_llm, tmp_path / "cache.sqlite", settings={"temperature": 0.7})
        assert other_settings.key(base) != llm.key(base)
        other_settings.close()


def test_failures_are_not_cached(tiny_llm, tmp_path):
    class Strict(BaseModel):  # well-formed replies that never validate: every call fails
        done: bool

        def model_post_init(self, _context):
            raise ValueError("never good enough")

    request = LLMRequest(messages=[ChatMessage(role="user", content="x")], output_schema=Strict)
    counting = CountingLLM(tiny_llm)
    with cached(counting, tmp_path / "cache.sqlite") as llm:
        [first] = llm.generate([request])
        assert first.error and "never good enough" in first.error
        llm.generate([request])
        assert len(counting.requests) == 2 and len(llm) == 0


def test_forget_drops_only_that_tag(tiny_llm, tmp_path):
    counting = CountingLLM(tiny_llm)
    with cached(counting, tmp_path / "cache.sqlite") as llm:
        llm.generate(batch(2, tag="alice") + batch(2, tag="bob"))
        assert llm.forget("alice") == 2
        results = llm.generate(batch(2, tag="alice") + batch(2, tag="bob"))
    assert [r.cached for r in results] == [False, False, True, True]
    assert len(counting.requests) == 6


def test_cache_file_is_private_and_in_wal_mode(tiny_llm, tmp_path):
    path = tmp_path / "nested" / "cache.sqlite"
    with cached(tiny_llm, path):
        pass
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_cache_opened_while_another_connection_holds_the_write_lock_waits(tiny_llm, tmp_path):
    """Workers opening one new cache file together: the one whose switch to WAL SQLite refuses at
    once (a read lock to upgrade while another connection holds the write lock) waits for the lock
    instead of failing, then finds or puts the file in WAL mode."""
    path = tmp_path / "cache.sqlite"
    with open_while_write_locked(path, lambda: cached(tiny_llm, path)), sqlite3.connect(path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


KILLED_RUN = textwrap.dedent(
    """
    import os, signal, sys
    sys.path.insert(0, sys.argv[1])
    from pathlib import Path
    from tests.llm.test_cache import CountingLLM, batch, cached
    from tests.tiny_model import tiny_transformers_llm

    class DiesMidRun(CountingLLM):
        def generate(self, requests):
            if len(self.requests) == int(sys.argv[4]):
                os.kill(os.getpid(), signal.SIGKILL)
            return super().generate(requests)

    inner = DiesMidRun(tiny_transformers_llm(Path(sys.argv[2]), max_new_tokens=40, max_retries=0))
    cached(inner, Path(sys.argv[3]), chunk_size=1).generate(batch(int(sys.argv[5])))
    """
)


@pytest.mark.slow  # a subprocess loads torch and the model (~15 s)
def test_run_killed_half_way_resumes_with_identical_results(tiny_llm, tiny_folder, tmp_path):
    total, done_before_kill = 5, 2
    path = tmp_path / "cache.sqlite"
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_RUN, str(REPO), str(tiny_folder), str(path), str(done_before_kill), str(total)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT COUNT(*) FROM llm_calls").fetchone()[0] == done_before_kill

    counting = CountingLLM(tiny_llm)
    with cached(counting, path, chunk_size=1) as llm:
        resumed = llm.generate(batch(total))
    assert len(counting.requests) == total - done_before_kill
    assert [r.cached for r in resumed] == [True] * done_before_kill + [False] * (total - done_before_kill)
    uncached = [tiny_llm.generate([request])[0] for request in batch(total)]
    assert [r.text for r in resumed] == [r.text for r in uncached]
    assert all(r.ok for r in resumed)


def test_build_llm_wraps_in_the_cache(tiny_folder, tmp_path):
    llm = build_llm(tiny_llm_config(max_new_tokens=40), model_path=tiny_folder, cache_path=tmp_path / "c.sqlite")
    assert isinstance(llm, CachedLLM) and llm.model_id == "transformers:tiny-random-llama"
    llm.generate(batch(1))
    assert llm.generate(batch(1))[0].cached
