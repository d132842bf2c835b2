"""The real vLLM engine and server (vLLM's CPU build, SmolLM2-135M converted to an HF checkpoint).

Run inside the vLLM venv (scripts/install_vllm.sh, then `hybridmem models convert
smollm2-135m-instruct`):

    .venv-vllm/bin/python -m pytest -m vllm tests/vllm/

Every test here carries the ``vllm`` marker and is skipped, with the reason, where vLLM does not
import (the main ``.venv``: vLLM cannot share it) or the converted model is absent. The
in-process engine is started once (module ``test_engine.py``, closed at its end so it does not
sit beside the server), the server once per session (``serve_vllm.sh start``; the fault tests
restart it and leave it running). vLLM's caches and sockets go under ``.vllm/``.

What these tests cannot show (no GPU here): CUDA, tensor/pipeline parallelism, Ray, Qwen3's
reasoning parser; tests/llm/test_vllm.py keeps stand-ins for those.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
VLLM_DIR = Path(__file__).resolve().parent
MODEL = "smollm2-135m-instruct-hf"
CPU_CONFIG = REPO / "configs" / "vllm-cpu.yaml"
#: Not the config's 8011, so a server someone started by hand is left alone.
TEST_PORT = int(os.environ.get("HYBRIDMEM_VLLM_TEST_PORT", "8013"))
STATE = REPO / ".vllm"

# vLLM's files stay in the project; the engine's processes inherit these (set before it starts).
os.environ.setdefault("VLLM_CACHE_ROOT", str(STATE / "cache"))
os.environ.setdefault("VLLM_RPC_BASE_PATH", str(STATE / "rpc"))
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(STATE / "inductor"))
# Without it vLLM finds "its" IP by a UDP connect to 8.8.8.8, which the no-egress guard records.
os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
(STATE / "rpc").mkdir(parents=True, exist_ok=True)


def _unavailable() -> str | None:
    if importlib.util.find_spec("vllm") is None:
        return (
            "vLLM is not installed in this interpreter (it needs its own venv): run scripts/install_vllm.sh, "
            "then .venv-vllm/bin/python -m pytest -m vllm tests/vllm/"
        )
    from hybridmem_local.errors import ModelRegistryError
    from hybridmem_local.weights.resolve import resolve_model

    try:
        resolve_model(MODEL, models_dir=REPO / "models")
    except ModelRegistryError:
        return (
            "the converted model is absent: run `hybridmem models convert smollm2-135m-instruct` (makes "
            f"models/{MODEL}/)"
        )
    return None


def pytest_collection_modifyitems(config, items):
    mine = [item for item in items if VLLM_DIR in Path(str(item.fspath)).parents]
    if not mine:
        return
    reason = _unavailable()
    for item in mine:
        item.add_marker(pytest.mark.vllm)
        item.add_marker(pytest.mark.slow)  # every one loads a real model (the fast loop skips them)
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def models_dir(monkeypatch_session) -> Path:
    monkeypatch_session.setenv("HYBRIDMEM_MODELS_DIR", str(REPO / "models"))
    return REPO / "models"


@pytest.fixture(scope="session")
def monkeypatch_session():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


@pytest.fixture(scope="session")
def cpu_config(models_dir):
    from hybridmem_local.config import load_config

    return load_config(CPU_CONFIG)


@pytest.fixture(scope="session")
def locomo_session(locomo_path):
    """A real LoCoMo dev session: conv-26's first (18 turns), in its own namespace."""
    from hybridmem_local.eval.locomo import load_locomo

    conversation = load_locomo(locomo_path).conversations[0]
    return conversation.sessions[0]


@pytest.fixture(scope="session")
def minilm_cpu():
    from hybridmem_local.config import EmbedderConfig
    from hybridmem_local.embedding import build_embedder

    return build_embedder(EmbedderConfig(device="cpu"))


# --------------------------------------------------------------------------- the server


class Server:
    """``scripts/serve_vllm.sh start|stop`` on TEST_PORT with configs/vllm-cpu.yaml's settings."""

    def __init__(self, config_path: Path, port: int):
        self.config_path = config_path
        self.port = port
        self.base_url = f"http://127.0.0.1:{port}/v1"
        self.start_s: float | None = None

    def _script(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["bash", str(REPO / "scripts" / "serve_vllm.sh"), *args, "--config", str(self.config_path)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def start(self) -> None:
        started = time.perf_counter()
        run = self._script("start")
        if run.returncode != 0:
            raise RuntimeError(f"serve_vllm.sh start failed:\n{run.stdout}\n{run.stderr}")
        self.start_s = time.perf_counter() - started

    def stop(self) -> None:
        self._script("stop", timeout=120)

    @property
    def pid(self) -> int:
        return int((STATE / f"serve-{self.port}.pid").read_text())

    def kill(self) -> None:
        """SIGKILL the whole server (its process group): a crash, not a shutdown."""
        os.killpg(self.pid, 9)
        for _ in range(100):
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        (STATE / f"serve-{self.port}.pid").unlink(missing_ok=True)


@pytest.fixture(scope="session")
def server(tmp_path_factory, models_dir):
    data = yaml.safe_load(CPU_CONFIG.read_text())
    data["llm"]["backend"] = "openai-server"
    data["llm"]["base_url"] = f"http://127.0.0.1:{TEST_PORT}/v1"
    config_path = tmp_path_factory.mktemp("server") / "vllm-server-cpu.yaml"
    config_path.write_text(yaml.safe_dump(data))
    handle = Server(config_path, TEST_PORT)
    handle.stop()  # a server left over by an interrupted run
    handle.start()
    yield handle
    handle.stop()


@pytest.fixture(scope="session")
def server_config(server, cpu_config):
    return cpu_config.model_copy(
        update={"llm": cpu_config.llm.model_copy(update={"backend": "openai-server", "base_url": server.base_url})}
    )
