"""Offline mode: no hub library reaches the network or sends telemetry.

:func:`enforce_offline` is called before a model loads by the embedder
(``embedding.SentenceTransformerEmbedder``) and by ``llm.build_llm`` for every backend that
loads weights in this process (llama.cpp, transformers, vLLM offline), so no hub library can
reach the network or send telemetry at run time; the ``openai-server`` backend talks only to
the server its config names. Model files come from :mod:`hybridmem_local.weights.resolve`; the
only download is ``hybridmem models download`` (``weights.hub.download(...,
allow_network=True)``). No config setting opens the network.
"""

from __future__ import annotations

import os
import sys
from typing import Any

#: Each variable and the value that switches its library's network use off.
OFFLINE_ENV: dict[str, str] = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    # not network: stops the tokenizers fork warning/deadlock in worker processes
    "TOKENIZERS_PARALLELISM": "false",
}


def enforce_offline(allow_network: bool = False) -> dict[str, str]:
    """Switch hub libraries to offline mode in this process (and its children); idempotent.

    Sets :data:`OFFLINE_ENV` and, because ``huggingface_hub`` reads ``HF_HUB_OFFLINE`` once
    at import, also flips its already-imported constants (transformers and
    sentence-transformers ask ``huggingface_hub.is_offline_mode()``). Returns the variables
    set; with ``allow_network=True`` nothing is changed and ``{}`` comes back.
    """
    if allow_network:
        return {}
    os.environ.update(OFFLINE_ENV)
    if "huggingface_hub.constants" in sys.modules:  # already imported: importing it again is free
        from huggingface_hub import constants as hub_constants

        hub_constants.HF_HUB_OFFLINE = True
        hub_constants.HF_HUB_DISABLE_TELEMETRY = True
    return dict(OFFLINE_ENV)


def offline_status() -> dict[str, Any]:
    """The offline variables as they are now, and whether all of them are in force."""
    env = {name: os.environ.get(name) for name in OFFLINE_ENV}
    hub_constants = sys.modules.get("huggingface_hub.constants")
    hub_offline = None if hub_constants is None else bool(hub_constants.HF_HUB_OFFLINE)
    in_force = all(env[name] == value for name, value in OFFLINE_ENV.items()) and hub_offline is not False
    return {"in_force": in_force, "env": env, "huggingface_hub_offline": hub_offline}
