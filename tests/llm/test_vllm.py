"""vLLM paths that cannot run on CPUs (GPU arguments, tensor/pipeline parallel, Ray, Qwen3's
reasoning parser) and fast plumbing checks: the in-process backend against a stand-in ``vllm``
module shaped like vLLM 0.33.0's (``LLM.__init__``/``LLM.chat`` keywords, ``SamplingParams``,
``StructuredOutputsParams``, ``RequestOutput``/``CompletionOutput``), the vLLM configs, and the
``vllm serve`` command line that scripts/serve_vllm.sh builds. The real engine and server
(vLLM's CPU build) run in tests/vllm/ (``.venv-vllm/bin/python -m pytest -m vllm tests/vllm/``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from hybridmem_local.config import load_config
from hybridmem_local.llm import ChatMessage, LLMRequest, build_llm

REPO = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------- stand-in vllm


@dataclass
class StructuredOutputsParams:
    """vllm.sampling_params.StructuredOutputsParams (0.33.0): exactly one constraint."""

    json: str | dict | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None
    structural_tag: str | None = None

    def __post_init__(self):
        constraints = [self.json, self.regex, self.choice, self.grammar, self.json_object, self.structural_tag]
        if sum(c is not None for c in constraints) != 1:
            raise ValueError(f"exactly one kind of structured outputs constraint is required: {self}")


@dataclass(kw_only=True)
class SamplingParams:
    """The vllm.SamplingParams fields this project sets (keyword-only, real defaults)."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    max_tokens: int | None = 16
    skip_special_tokens: bool = True
    structured_outputs: StructuredOutputsParams | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: Any
    finish_reason: str | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int] | None
    prompt_logprobs: Any
    outputs: list[CompletionOutput]
    finished: bool


class FakeTokenizer:
    def encode(self, text, truncation=None, max_length=None, add_special_tokens=True):
        return list(range(len(text.split())))


@dataclass
class ChatCall:
    messages: list
    sampling_params: list
    use_tqdm: bool
    chat_template_kwargs: dict | None


class FakeLLM:
    """Replies ``<think>…</think>`` + a Fact for JSON requests (a cut-off one first for a
    conversation whose user message says 'truncate'), plain text otherwise."""

    instances: list[FakeLLM] = []

    def __init__(
        self,
        model: str,
        *,
        tensor_parallel_size: int = 1,
        seed: int = 0,
        gpu_memory_utilization: float = 0.92,
        **kwargs: Any,
    ):
        self.init_args = {
            "model": model,
            "tensor_parallel_size": tensor_parallel_size,
            "seed": seed,
            "gpu_memory_utilization": gpu_memory_utilization,
            **kwargs,
        }
        self.calls: list[ChatCall] = []
        FakeLLM.instances.append(self)

    def get_tokenizer(self):
        return FakeTokenizer()

    def chat(
        self,
        messages,
        sampling_params=None,
        use_tqdm=True,
        lora_request=None,
        priority=None,
        chat_template=None,
        chat_template_content_format="auto",
        add_generation_prompt=True,
        continue_final_message=False,
        tools=None,
        chat_template_kwargs=None,
        tokenization_kwargs=None,
        mm_processor_kwargs=None,
    ):
        self.calls.append(ChatCall(messages, sampling_params, use_tqdm, chat_template_kwargs))
        outputs = []
        for i, (conversation, params) in enumerate(zip(messages, sampling_params, strict=True)):
            user = conversation[0]["content"]
            finish = "stop"
            if params.structured_outputs is None:
                text = f"<think>about {user}</think>\n\nanswer to {user}"
            elif "truncate" in user and len(conversation) == 1:
                text, finish = '<think>hm</think>{"entity": "Carol', "length"
            else:
                text = "<think>\nlet me see\n</think>\n\n" + json.dumps({"entity": user, "year": 2023})
            outputs.append(
                RequestOutput(
                    request_id=str(i),
                    prompt=None,
                    prompt_token_ids=list(range(sum(len(m["content"].split()) for m in conversation))),
                    prompt_logprobs=None,
                    outputs=[CompletionOutput(0, text, list(range(len(text.split()))), None, None, finish)],
                    finished=True,
                )
            )
        return outputs


@pytest.fixture
def fake_vllm(monkeypatch):
    vllm = types.ModuleType("vllm")
    sampling = types.ModuleType("vllm.sampling_params")
    vllm.LLM, vllm.SamplingParams, vllm.RequestOutput = FakeLLM, SamplingParams, RequestOutput
    sampling.SamplingParams, sampling.StructuredOutputsParams = SamplingParams, StructuredOutputsParams
    vllm.sampling_params = sampling
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.sampling_params", sampling)
    FakeLLM.instances.clear()
    return FakeLLM


class Fact(BaseModel):
    entity: str
    year: int


def ask(content: str, schema=Fact, **fields) -> LLMRequest:
    return LLMRequest(messages=[ChatMessage(role="user", content=content)], output_schema=schema, **fields)


def build_offline(tmp_path, **overrides):
    config = load_config(REPO / "configs" / "vllm-offline.yaml").llm.model_copy(update=overrides)
    return build_llm(config, model_path=tmp_path / "qwen3-8b")


def test_engine_gets_the_configured_parallelism(fake_vllm, tmp_path):
    build_offline(tmp_path, tensor_parallel_size=2, pipeline_parallel_size=2, distributed_executor_backend="ray")
    [engine] = fake_vllm.instances
    assert engine.init_args == {
        "model": str(tmp_path / "qwen3-8b"),
        "served_model_name": "qwen3-8b",
        "tensor_parallel_size": 2,
        "pipeline_parallel_size": 2,
        "gpu_memory_utilization": 0.9,
        "seed": 0,
        "max_model_len": 32768,
        "distributed_executor_backend": "ray",
        "reasoning_parser": "qwen3",
    }


def test_cpu_build_gets_cpu_arguments_and_kv_cache_space(fake_vllm, tmp_path, monkeypatch):
    """On vLLM's CPU build (real runs: tests/vllm/) no GPU-only argument is passed and the KV
    cache size travels in the environment the engine's worker processes inherit."""
    monkeypatch.setitem(
        sys.modules, "vllm.platforms", types.SimpleNamespace(current_platform=types.SimpleNamespace(device_type="cpu"))
    )
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    config = load_config(REPO / "configs" / "vllm-cpu.yaml").llm
    build_llm(config, model_path=tmp_path / "smollm2-hf")
    [engine] = fake_vllm.instances
    # tensor_parallel_size 1 and gpu_memory_utilization 0.92 are the stand-in's defaults: not passed.
    assert engine.init_args == {
        "model": str(tmp_path / "smollm2-hf"),
        "served_model_name": "smollm2-135m-instruct-hf",
        "tensor_parallel_size": 1,
        "gpu_memory_utilization": 0.92,
        "seed": 0,
        "max_model_len": 4096,
        "dtype": "bfloat16",
        "enforce_eager": True,
        "max_num_seqs": 8,
        # compact_json: true in the config, named backend (vLLM refuses the flag under "auto")
        "structured_outputs_config": {"backend": "xgrammar", "disable_any_whitespace": True},
    }
    assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == "2"
    fake_vllm.instances.clear()
    build_llm(config.model_copy(update={"compact_json": False}), model_path=tmp_path / "smollm2-hf")
    assert "structured_outputs_config" not in fake_vllm.instances[0].init_args


def test_serve_args_match_the_engine_arguments(tmp_path):
    from hybridmem_local.llm.serve_args import serve_command

    config = load_config(REPO / "configs" / "vllm-cpu.yaml").llm
    args, env = serve_command(config, tmp_path / "m", "cpu")
    assert args[:6] == ["serve", str(tmp_path / "m"), "--host", "127.0.0.1", "--port", "8011"]
    assert "--gpu-memory-utilization" not in args and "--tensor-parallel-size" not in args
    assert "--enforce-eager" in args and args[args.index("--dtype") + 1] == "bfloat16"
    assert json.loads(args[args.index("--structured-outputs-config") + 1]) == {
        "backend": "xgrammar",
        "disable_any_whitespace": True,
    }
    free_whitespace, _ = serve_command(config.model_copy(update={"compact_json": False}), tmp_path / "m", "cpu")
    assert "--structured-outputs-config" not in free_whitespace
    assert env == {"VLLM_CPU_KVCACHE_SPACE": "2"}
    gpu_args, gpu_env = serve_command(config.model_copy(update={"tensor_parallel_size": 2}), tmp_path / "m", "cuda")
    assert gpu_args[gpu_args.index("--tensor-parallel-size") + 1] == "2"
    assert gpu_args[gpu_args.index("--gpu-memory-utilization") + 1] == "0.9" and gpu_env == {}


def test_batch_is_one_chat_call_with_schema_and_thinking_off(fake_vllm, tmp_path):
    llm = build_offline(tmp_path)
    names = ["Caroline", "Melanie", "Jon"]
    results = llm.generate([ask(name) for name in names])

    [engine] = fake_vllm.instances
    [call] = engine.calls
    assert call.chat_template_kwargs == {"enable_thinking": False}
    assert call.use_tqdm is False
    assert [conversation[0]["content"] for conversation in call.messages] == names
    for params in call.sampling_params:
        assert params.structured_outputs.json == Fact.model_json_schema()
        assert (params.temperature, params.seed, params.max_tokens) == (0.0, 0, 2048)
    assert [r.parsed for r in results] == [Fact(entity=name, year=2023) for name in names]
    assert all("<think>" not in r.text and r.text.startswith("{") for r in results)
    assert results[0].prompt_tokens == 1 and results[0].completion_tokens > 0


def test_thinking_requests_go_in_their_own_call_and_text_is_stripped(fake_vllm, tmp_path):
    llm = build_offline(tmp_path)
    results = llm.generate([ask("a"), ask("b", schema=None, enable_thinking=True, max_new_tokens=64), ask("c")])
    [engine] = fake_vllm.instances
    assert [(c.chat_template_kwargs, len(c.messages)) for c in engine.calls] == [
        ({"enable_thinking": False}, 2),
        ({"enable_thinking": True}, 1),
    ]
    thinking_params = engine.calls[1].sampling_params[0]
    assert thinking_params.structured_outputs is None and thinking_params.max_tokens == 64
    assert [r.text for r in results] == [
        '{"entity": "a", "year": 2023}',
        "answer to b",
        '{"entity": "c", "year": 2023}',
    ]


def test_cut_off_reply_is_retried_alone_with_feedback(fake_vllm, tmp_path):
    llm = build_offline(tmp_path)
    results = llm.generate([ask("fine"), ask("truncate me")])
    first, retry = fake_vllm.instances[0].calls
    assert len(first.messages) == 2 and len(retry.messages) == 1
    assert "cut off at max_new_tokens" in retry.messages[0][2]["content"]
    assert [r.parsed.entity for r in results] == ["fine", "truncate me"]


# --------------------------------------------------------------------------- configs and script


def test_vllm_configs_validate_and_name_the_qwen3_manifest_entry():
    offline = load_config(REPO / "configs" / "vllm-offline.yaml").llm
    server = load_config(REPO / "configs" / "vllm-server.yaml").llm
    assert (offline.backend, server.backend) == ("vllm-offline", "openai-server")
    assert offline.model == server.model == "qwen3-8b"
    assert offline.context_tokens + offline.max_new_tokens <= offline.max_model_len
    assert server.base_url.endswith("/v1")


def serve_command(tmp_path, env: dict[str, str], *extra: str) -> subprocess.CompletedProcess:
    """Run serve_vllm.sh with a stand-in ``vllm`` executable that prints its argv and env."""
    stand_in = tmp_path / "vllm"
    stand_in.write_text(
        "#!/usr/bin/env python3\nimport json, os, sys\n"
        "print(json.dumps({'argv': sys.argv[1:], 'env': {k: os.environ.get(k) for k in "
        "['VLLM_NO_USAGE_STATS', 'DO_NOT_TRACK', 'HF_HUB_OFFLINE']}}))\n"
    )
    stand_in.chmod(0o755)
    base = {key: value for key, value in os.environ.items() if not key.startswith("HYBRIDMEM_")}
    return subprocess.run(
        ["bash", str(REPO / "scripts" / "serve_vllm.sh"), *extra],
        env={**base, "HYBRIDMEM_VLLM": str(stand_in), **env},
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_serve_script_builds_the_vllm_serve_command(tmp_path):
    model = tmp_path / "Qwen3-8B"
    model.mkdir()
    (model / "config.json").write_text("{}")
    run = serve_command(
        tmp_path,
        {
            "HYBRIDMEM_MODEL_PATH": str(model),
            "HYBRIDMEM_TP": "2",
            "HYBRIDMEM_PP": "2",
            "HYBRIDMEM_EXECUTOR": "ray",
            "HYBRIDMEM_API_KEY": "sk-local",
        },
        "--enforce-eager",
    )
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    argv = out["argv"]
    assert argv[:2] == ["serve", str(model)]
    flags = dict(zip(argv[2:-1:2], argv[3::2], strict=True))
    assert flags == {
        "--served-model-name": "qwen3-8b",
        "--host": "127.0.0.1",
        "--port": "8000",
        "--tensor-parallel-size": "2",
        "--pipeline-parallel-size": "2",
        "--max-model-len": "32768",
        "--gpu-memory-utilization": "0.90",
        "--reasoning-parser": "qwen3",
        "--seed": "0",
        "--distributed-executor-backend": "ray",
        "--api-key": "sk-local",
    }
    assert argv[-1] == "--enforce-eager"
    assert out["env"] == {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1"}
    server = load_config(REPO / "configs" / "vllm-server.yaml").llm
    assert server.base_url == f"http://{flags['--host']}:{flags['--port']}/v1"
    assert server.model == flags["--served-model-name"]


def test_serve_script_refuses_a_missing_model(tmp_path):
    run = serve_command(tmp_path, {"HYBRIDMEM_MODEL_PATH": str(tmp_path / "nowhere")})
    assert run.returncode == 2
    assert f"no model at {tmp_path / 'nowhere'}" in run.stderr
