"""What an evaluation run is asked to do: the benchmark, the systems and their sweeps.

options = RunOptions(benchmark="locomo", data=Path("locomo10.json"), out=Path("runs/eval"), ks=[2, 5])
system_runs(options, config)  # hybrid, hybrid@k2, hybrid@k5, rag, ...
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from hybridmem_local.config import Config
from hybridmem_local.eval import Benchmark
from hybridmem_local.eval.judge import LocomoJudge
from hybridmem_local.eval.judge_audit import DEFAULT_AUDIT_SIZE
from hybridmem_local.eval.systems import DEFAULT_RAG_BUDGET, SYSTEMS
from hybridmem_local.schema import StrictModel

#: Retrieval budgets at which recall@k is reported (the paper's k sweep: 2, 5, 10, 20).
DEFAULT_RECALL_KS = [2, 5, 10, 20]
#: Questions per batched answer (and judge) call; each batch is saved before the next starts.
DEFAULT_BATCH_SIZE = 32


class RunOptions(StrictModel):
    benchmark: Benchmark
    data: Path
    out: Path
    systems: list[str] = Field(default_factory=lambda: list(SYSTEMS))
    #: LoCoMo sample ids / LongMemEval question ids; None = all.
    conversations: list[str] | None = None
    #: Questions per conversation (LoCoMo) or instances (LongMemEval), first ones first.
    limit: int | None = Field(default=None, ge=1)
    #: A stratified sample of this many questions over every conversation of the file
    #: (``eval/sampling.py``), drawn before ``conversations`` selects: shards agree on it.
    sample: int | None = Field(default=None, ge=1)
    sample_seed: int = 0
    #: Corrected gold answers and evidence (LoCoMo audit ``errors.json``): every question is
    #: scored against both golds.
    audited_gold: Path | None = None
    #: Ingest only the first N sessions of each conversation (questions are all kept).
    max_sessions: int | None = Field(default=None, ge=1)
    #: No answering, judging or curation: retrieval metrics from existing (curated) stores.
    retrieval_only: bool = False
    #: Curate again the sessions whose curation failed in an earlier run (e.g. after a config fix).
    retry_failed: bool = False
    #: Write each store's memories into ``out/memories/`` as they are made and rebuild a missing
    #: store from them (``checkpoints.py``): the results folder alone resumes the run elsewhere.
    checkpoints: bool = False
    #: Retrieval budgets to sweep for the memory systems (None: ``retrieval.k`` only).
    ks: list[int] | None = None
    #: min_cluster_size values to sweep for hybrid+consolidation (None: the config's).
    mcs: list[int] | None = None
    include_adversarial: bool = False
    rag_budget: int = Field(default=DEFAULT_RAG_BUDGET, ge=1)
    recall_ks: list[int] = Field(default_factory=lambda: list(DEFAULT_RECALL_KS))
    batch_size: int = Field(default=DEFAULT_BATCH_SIZE, ge=1)
    #: Planted wrong answers the judge grades for its false-accept rate (0: no audit).
    judge_audit: int = Field(default=DEFAULT_AUDIT_SIZE, ge=0)
    #: The LoCoMo judge prompt: mem0's (what papers report) or the strict one (``eval/judge.py``).
    judge_prompt: LocomoJudge = "mem0"
    #: Gold answers reworded (same meaning) the judge grades, for its false-reject rate (0: none).
    judge_rewordings: int = Field(default=0, ge=0)
    #: Folder of the per-conversation stores (default OUT/stores); share it between runs.
    stores: Path | None = None
    #: The LLM call cache (default OUT/llm_cache.sqlite).
    llm_cache: Path | None = None
    #: The command line, for the manifest.
    command: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check(self) -> RunOptions:
        unknown = [s for s in self.systems if s not in SYSTEMS]
        if unknown:
            raise ValueError(f"unknown system(s) {unknown}; choose from {', '.join(SYSTEMS)}")
        if not self.systems:
            raise ValueError("no system to evaluate")
        for name, values in (("k", self.ks), ("mcs", self.mcs), ("recall k", self.recall_ks)):
            if values is not None and (not values or min(values) < 1):
                raise ValueError(f"{name} values must be positive integers, got {values}")
        if self.mcs is not None and min(self.mcs) < 2:
            raise ValueError(f"min_cluster_size must be at least 2 (HDBSCAN), got {self.mcs}")
        if self.ks:
            self.recall_ks = sorted(set(self.recall_ks) | set(self.ks))
        if self.mcs and "hybrid+consolidation" not in self.systems:
            self.systems = [*self.systems, "hybrid+consolidation"]
        if self.ks and not any(SYSTEMS[s].ranked and SYSTEMS[s].needs != "raw" for s in self.systems):
            raise ValueError("--k sweeps the memory systems; none is among --systems")
        if self.sample is not None and self.limit is not None:
            raise ValueError("--sample and --limit both choose questions; give one")
        if self.judge_prompt != "mem0" and self.benchmark != "locomo":
            raise ValueError("--judge-prompt applies to LoCoMo only (LongMemEval has a prompt per question type)")
        if self.audited_gold is not None and self.benchmark != "locomo":
            raise ValueError("--audited-gold applies to LoCoMo only")
        if self.include_adversarial and self.benchmark != "locomo":
            raise ValueError("--include-adversarial applies to LoCoMo only")
        return self

    @property
    def stores_dir(self) -> Path:
        return self.stores or self.out / "stores"

    @property
    def cache_path(self) -> Path:
        return self.llm_cache or self.out / "llm_cache.sqlite"


class SystemRun(StrictModel):
    """One system variant: a registry name with a retrieval budget and, for consolidation, an mcs."""

    label: str
    system: str
    k: int
    mcs: int | None = None


def system_runs(options: RunOptions, config: Config) -> list[SystemRun]:
    """The variants to evaluate: each system at each swept k (memory systems) and mcs.

    A variant at the config's own k / mcs keeps the plain system name; others get
    ``@kN`` / ``@mcsN`` appended.
    """
    base_k = config.retrieval.k
    base_mcs = config.consolidation.hdbscan.min_cluster_size
    runs = []
    for name in options.systems:
        cls = SYSTEMS[name]
        sweeps_k = cls.ranked and cls.needs != "raw"
        ks = (options.ks or [base_k]) if sweeps_k else [base_k]
        mcss: list[int | None] = list(options.mcs or [base_mcs]) if cls.needs == "consolidated" else [None]
        for mcs in mcss:
            for k in ks:
                label = name + (f"@mcs{mcs}" if mcs not in (None, base_mcs) else "") + (f"@k{k}" if k != base_k else "")
                runs.append(SystemRun(label=label, system=name, k=k, mcs=mcs))
    return runs
