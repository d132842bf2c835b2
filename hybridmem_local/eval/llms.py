"""The answer and judge LLMs of an evaluation run.

One model serves every conversation's store (``HybridMemory.open(..., llm=...)``), behind the
run's own call cache, so the model loads once per run and a rerun asks it nothing; a store's
own LLM (``llm/factory.py``) would load it once per conversation.
"""

from __future__ import annotations

from pathlib import Path

from hybridmem_local.config import Config
from hybridmem_local.llm.base import StructuredLLM


class Models:
    """The run's answer and judge LLMs, built on first use, behind one on-disk call cache."""

    def __init__(self, config: Config, cache_path: Path):
        self.config = config
        self.cache_path = cache_path
        self._answer: StructuredLLM | None = None
        self._judge: StructuredLLM | None = None

    @property
    def answer(self) -> StructuredLLM:
        if self._answer is None:
            from hybridmem_local.llm import build_llm

            self._answer = build_llm(self.config.llm, cache_path=self.cache_path)
        return self._answer

    @property
    def judge(self) -> StructuredLLM:
        judge_config = self.config.judge
        if judge_config is None or judge_config == self.config.llm:
            return self.answer
        if self._judge is None:
            from hybridmem_local.llm import build_llm

            self._judge = build_llm(judge_config, cache_path=self.cache_path)
        return self._judge

    def judge_model_id(self) -> str:
        judge = self.config.judge or self.config.llm
        return f"{judge.backend}:{judge.model}"

    def close(self) -> None:
        for llm in {id(m): m for m in (self._answer, self._judge) if m is not None}.values():
            llm.close()
