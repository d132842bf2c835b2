"""Evaluation harness: benchmark loaders, metrics, the LLM judge, runners and reports.

Modules: ``locomo`` and ``longmemeval`` (loaders), ``metrics`` (F1, BLEU-1, retrieval recall),
``judge`` (judge prompts and verdict schema), ``options``, ``benchmarks``, ``accounting``,
``records``, ``runner`` and ``report`` (a run). Nothing heavy is imported here; this module only
holds what the harness shares: the benchmark names and the loaders' error type. The loaders
read files with the library's readers (``hybridmem_local.ingest``).
"""

from __future__ import annotations

from typing import Literal

from hybridmem_local.ingest import InputFileError

#: The benchmarks the harness runs.
Benchmark = Literal["locomo", "longmemeval"]


class DatasetError(InputFileError):
    """A benchmark file is unreadable or malformed; the message names file, record and field."""
