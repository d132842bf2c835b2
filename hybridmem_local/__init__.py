"""hybridmem-local: offline long-term memory for dialogue agents (episodic + relational stores).

Heavy dependencies (torch, sentence-transformers, llama.cpp, vLLM, cuML, UMAP) are imported
only by the backend that needs them, so importing this package stays fast.
"""

from hybridmem_local.config import Config, load_config
from hybridmem_local.memory import HybridMemory
from hybridmem_local.schema import (
    CurationResult,
    Episode,
    EpisodeDraft,
    Hit,
    MemoryStatus,
    RelationalTuple,
    SearchResult,
    Session,
    TupleDraft,
    Turn,
)

__version__ = "0.1.0"

__all__ = [
    "Config",
    "CurationResult",
    "Episode",
    "EpisodeDraft",
    "Hit",
    "HybridMemory",
    "MemoryStatus",
    "RelationalTuple",
    "SearchResult",
    "Session",
    "Turn",
    "TupleDraft",
    "load_config",
]
