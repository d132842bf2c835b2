"""The ``vllm serve`` command line for an ``llm`` config section: scripts/serve_vllm.sh --config FILE.

The flags are derived from the same :func:`~hybridmem_local.llm.vllm_offline.engine_arguments`
as the in-process backend, so a config means the same engine either way: on the CPU build
``--gpu-memory-utilization`` and default parallel sizes are left out and the KV cache size
travels as ``VLLM_CPU_KVCACHE_SPACE``. The model is resolved through the manifest (a name,
never a hub id); host and port come from ``llm.base_url``.

    python -m hybridmem_local.llm.serve_args configs/vllm-cpu.yaml [--device cpu|cuda]

prints bash assignments (``serve_args=(...)``, ``serve_env=(...)``, ``serve_host=``,
``serve_port=``) for the script to ``eval``.
"""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path
from urllib.parse import urlparse

from hybridmem_local.config import LLMConfig, load_config
from hybridmem_local.llm.vllm_offline import engine_arguments

#: engine_arguments key -> ``vllm serve`` flag (the model is the positional argument).
_FLAGS = {
    "served_model_name": "--served-model-name",
    "tensor_parallel_size": "--tensor-parallel-size",
    "pipeline_parallel_size": "--pipeline-parallel-size",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "seed": "--seed",
    "max_model_len": "--max-model-len",
    "distributed_executor_backend": "--distributed-executor-backend",
    "reasoning_parser": "--reasoning-parser",
    "dtype": "--dtype",
    "max_num_seqs": "--max-num-seqs",
}


def host_and_port(config: LLMConfig) -> tuple[str, int]:
    parsed = urlparse(config.base_url or "http://127.0.0.1:8000/v1")
    return parsed.hostname or "127.0.0.1", parsed.port or 8000


def serve_command(config: LLMConfig, model_path: Path, device: str) -> tuple[list[str], dict[str, str]]:
    """(arguments after ``vllm``, environment) that serve ``config``'s model on ``device``."""
    engine = engine_arguments(config, model_path, device)
    host, port = host_and_port(config)
    args = ["serve", engine.pop("model"), "--host", host, "--port", str(port)]
    if engine.pop("enforce_eager", None):
        args.append("--enforce-eager")
    structured = engine.pop("structured_outputs_config", None)
    if structured:
        args += ["--structured-outputs-config", json.dumps(structured)]
    for key, value in engine.items():
        args += [_FLAGS[key], str(value)]
    env = {}
    if device == "cpu" and config.cpu_kvcache_space_gib is not None:
        env["VLLM_CPU_KVCACHE_SPACE"] = f"{config.cpu_kvcache_space_gib:g}"
    return args, env


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", type=Path)
    parser.add_argument("--device", default=None, help="cpu or cuda (default: the installed vLLM build's)")
    options = parser.parse_args(argv)
    config = load_config(options.config).llm
    from hybridmem_local.weights.resolve import resolve_model

    model_path = resolve_model(config.model, explicit_path=config.path).path
    device = options.device
    if device is None:
        from hybridmem_local.llm.vllm_offline import vllm_device

        device = vllm_device()
    args, env = serve_command(config, model_path, device)
    host, port = host_and_port(config)
    print(f"serve_args=({' '.join(shlex.quote(a) for a in args)})")
    print(f"serve_env=({' '.join(shlex.quote(f'{k}={v}') for k, v in env.items())})")
    print(f"serve_host={shlex.quote(host)}")
    print(f"serve_port={port}")
    print(f"serve_device={shlex.quote(device)}")


if __name__ == "__main__":
    main()
