"""Fixtures of the fault suite: the writer zygote (one MiniLM load for every kill)."""

from __future__ import annotations

import pytest

from tests.faults.writer import Zygote


@pytest.fixture(scope="session")
def zygote(tmp_path_factory):
    z = Zygote(tmp_path_factory.mktemp("zygote") / "zygote.log")
    yield z
    z.close()


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Query embeddings on one intra-op thread: on 2 busy shared cores, torch's 2-thread pool
    made a single MiniLM query ~30× slower (1.1 s against 36 ms). Restored after each test."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
