"""Evaluation harness: benchmark loaders, metrics, the LLM judge, runners and reports.

Modules: ``locomo`` and ``longmemeval`` (loaders), ``metrics`` (F1, BLEU-1, retrieval recall),
``judge`` (judge prompts and verdict schema), ``options``, ``benchmarks``, ``accounting``,
``records``, ``runner`` and ``report`` (a run). Nothing heavy is imported here; this module only
holds the benchmark names the harness shares. The loaders read files with the library's readers
(``hybridmem_local.files.session_files``) and raise ``hybridmem_local.errors.DatasetError``.
"""

from __future__ import annotations

from typing import Literal

#: The benchmarks the harness runs.
Benchmark = Literal["locomo", "longmemeval"]
