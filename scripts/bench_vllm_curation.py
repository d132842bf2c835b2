"""Curation of the same 8 LoCoMo dev sessions with SmolLM2-135M on one LLM backend.

Backends: ``llamacpp`` (the GGUF, in .venv), ``vllm-offline`` and ``openai-server`` (the
converted checkpoint on vLLM's CPU build, in .venv-vllm; the server is started and stopped by
scripts/serve_vllm.sh). The sessions are the first session of each of the 8 dev
conversations; curation is ``Curator.curate`` on all 8 at once (one batched call per round),
without the call cache, store or embedder. Reported: backend start-up, curation wall time,
sessions/minute, LLM requests, prompt/completion tokens, share of sessions curated (every
window's reply schema-valid), memories, and the peak resident memory of the whole process
tree (this process and its children; for the server, the server's processes as well),
sampled every 0.2 s.

    .venv/bin/python scripts/bench_vllm_curation.py --backend llamacpp --out runs/bench_curation_llamacpp.json
    .venv-vllm/bin/python scripts/bench_vllm_curation.py --backend vllm-offline --out runs/bench_curation_vllm.json
    .venv-vllm/bin/python scripts/bench_vllm_curation.py --backend openai-server --out runs/bench_curation_server.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
DEFAULT_LOCOMO = REPO.parent / "shared" / "data" / "locomo" / "locomo_dev8.json"


class PeakRSS:
    """Peak summed RSS of some process trees, sampled in a thread."""

    def __init__(self, roots: list[int]):
        self.roots = roots
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> int:
        total = 0
        for root in self.roots:
            try:
                process = psutil.Process(root)
                tree = [process, *process.children(recursive=True)]
            except psutil.NoSuchProcess:
                continue
            for member in tree:
                with contextlib.suppress(psutil.NoSuchProcess):
                    total += member.memory_info().rss
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._sample())
            time.sleep(0.2)

    def __enter__(self) -> PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._sample())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["llamacpp", "vllm-offline", "openai-server"], required=True)
    parser.add_argument("--locomo", type=Path, default=DEFAULT_LOCOMO)
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    from hybridmem_local.config import LLMConfig, load_config
    from hybridmem_local.curation.curator import Curator
    from hybridmem_local.eval.locomo import load_locomo
    from hybridmem_local.llm import build_llm
    from hybridmem_local.weights.offline import enforce_offline

    enforce_offline()
    conversations = load_locomo(args.locomo).conversations
    sessions = [c.sessions[0] for c in conversations][: args.sessions]
    # The same model and curation settings on every backend: SmolLM2 with configs/vllm-cpu.yaml's
    # curation section (the embedded default is now Qwen2.5-Coder; scripts/bench_curation_models.py).
    cpu_config = load_config(REPO / "configs" / "vllm-cpu.yaml")
    if args.backend == "llamacpp":
        llm_config = LLMConfig(model="smollm2-135m-instruct")
    else:
        llm_config = cpu_config.llm
        if args.backend == "openai-server":
            llm_config = llm_config.model_copy(update={"backend": "openai-server"})
    roots = [os.getpid()]
    server_start_s = None
    config_file = None
    if args.backend == "openai-server":
        config_file = REPO / ".vllm" / "bench-server.yaml"
        config_file.parent.mkdir(exist_ok=True)
        config_file.write_text(json.dumps({"llm": json.loads(llm_config.model_dump_json())}))
        started = time.perf_counter()
        subprocess.run(
            ["bash", str(REPO / "scripts" / "serve_vllm.sh"), "start", "--config", str(config_file)],
            check=True,
            cwd=REPO,
        )
        server_start_s = time.perf_counter() - started
        port = llm_config.base_url.rsplit(":", 1)[1].split("/")[0]
        roots.append(int((REPO / ".vllm" / f"serve-{port}.pid").read_text()))
    try:
        with PeakRSS(roots) as peak:
            started = time.perf_counter()
            llm = build_llm(llm_config)
            start_s = time.perf_counter() - started
            curator = Curator(llm, llm_config, cpu_config.curation)
            started = time.perf_counter()
            outcomes = curator.curate(sessions)
            curate_s = time.perf_counter() - started
            llm.close()
    finally:
        if config_file is not None:
            subprocess.run(
                ["bash", str(REPO / "scripts" / "serve_vllm.sh"), "stop", "--config", str(config_file)], cwd=REPO
            )
    result = {
        "backend": args.backend,
        "model": llm_config.model,
        "sessions": len(sessions),
        "turns": sum(len(s.turns) for s in sessions),
        "server_start_s": server_start_s,
        "backend_start_s": round(start_s, 1),
        "curate_s": round(curate_s, 1),
        "sessions_per_min": round(len(sessions) / curate_s * 60, 2),
        "llm_requests": sum(o.usage.requests for o in outcomes),
        "windows": sum(o.windows for o in outcomes),
        "prompt_tokens": sum(o.usage.prompt_tokens for o in outcomes),
        "completion_tokens": sum(o.usage.completion_tokens for o in outcomes),
        "curated_share": round(sum(o.ok for o in outcomes) / len(outcomes), 3),
        "episodes": sum(len(o.result.episodes) for o in outcomes if o.result),
        "tuples": sum(len(o.result.tuples) for o in outcomes if o.result),
        "peak_rss_gb": round(peak.peak / 1e9, 2),
        "errors": [o.error for o in outcomes if o.error],
    }
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
