"""``hybridmem eval``: benchmark runs and their reports (a typer sub-app mounted by ``cli.py``).

    hybridmem eval locomo --data locomo10.json --config configs/vllm-offline.yaml --out runs/locomo
    hybridmem eval locomo --data locomo10.json --systems hybrid,rag --retrieval-only --out runs/recall
    hybridmem eval longmemeval --data longmemeval_s_cleaned.json --limit 50 --out runs/lme
    hybridmem eval report runs/locomo          # redraw summary.md/.csv and plots from summary.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer
import yaml
from rich.console import Console

from hybridmem_local.cli_errors import err, fail, reported
from hybridmem_local.config import ConfigError, load_config
from hybridmem_local.eval import DatasetError
from hybridmem_local.eval.systems import DEFAULT_RAG_BUDGET, SYSTEMS

app = typer.Typer(help="Evaluate on LoCoMo / LongMemEval and report.", no_args_is_help=True, add_completion=False)
console = Console()

ALL_SYSTEMS = ",".join(SYSTEMS)

DATA = typer.Option(..., "--data", help="Benchmark file (official JSON format).")
OUT = typer.Option(..., "--out", help="Results folder (created; a rerun resumes it).")
CONFIG = typer.Option(None, "--config", "-c", envvar="HYBRIDMEM_CONFIG", help="YAML config (default: built-in paper defaults).")
SET = typer.Option(None, "--set", help="Config override KEY=VALUE (dotted key, YAML value), repeatable.")
SYSTEMS_OPTION = typer.Option(ALL_SYSTEMS, "--systems", help=f"Comma-separated, from: {ALL_SYSTEMS}.")
LIMIT = typer.Option(None, "--limit", min=1, help="Questions per conversation (LongMemEval: instances).")
MAX_SESSIONS = typer.Option(None, "--max-sessions", min=1, help="Ingest only the first N sessions of each conversation.")
RETRIEVAL_ONLY = typer.Option(False, "--retrieval-only", help="Retrieval metrics only: no curation, answers or judge.")
RETRY_FAILED = typer.Option(False, "--retry-failed", help="Curate again sessions whose curation failed in an earlier run.")
K = typer.Option(None, "--k", help="Retrieval budgets to sweep for the memory systems, e.g. 2,5,10,20.")
MCS = typer.Option(None, "--mcs", help="min_cluster_size values to sweep for hybrid+consolidation, e.g. 2,5,10,20.")
BUDGET = typer.Option(DEFAULT_RAG_BUDGET, "--context-budget", min=1, help="The rag baseline's context budget (answer-model tokens).")
RECALL_K = typer.Option("2,5,10,20", "--recall-k", help="k values of evidence_recall@k / session_recall@k.")
BATCH = typer.Option(32, "--batch-size", min=1, help="Questions per batched answer/judge call (saved after each).")
STORES = typer.Option(None, "--stores", help="Folder of per-conversation stores (default OUT/stores); share it to reuse curation.")
CACHE = typer.Option(None, "--llm-cache", help="LLM call cache file (default OUT/llm_cache.sqlite).")


def _ints(value: Optional[str], option: str) -> list[int] | None:
    if value is None:
        return None
    try:
        return [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        raise typer.BadParameter(f"expected comma-separated integers, got {value!r}", param_hint=option) from None


def _names(value: Optional[str]) -> list[str] | None:
    return None if value is None else [part.strip() for part in value.split(",") if part.strip()]


def _overrides(pairs: Optional[list[str]]) -> dict:
    overrides = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise typer.BadParameter(f"expected KEY=VALUE, got {pair!r}", param_hint="--set")
        overrides[key.strip()] = yaml.safe_load(value)
    return overrides


def _run(benchmark: str, **kwargs) -> None:
    from hybridmem_local.eval.runner import RunOptions, run_evaluation
    from hybridmem_local.eval.report import SUMMARY_MD
    from hybridmem_local.model_registry import ModelRegistryError

    config_path, overrides = kwargs.pop("config"), kwargs.pop("overrides")
    # pydantic's ValidationError (bad options) is a ValueError.
    with reported(ConfigError, DatasetError, ModelRegistryError, ValueError, FileNotFoundError):
        config = load_config(config_path, overrides)
        options = RunOptions(benchmark=benchmark, command=sys.argv, **kwargs)
        result = run_evaluation(options, config, console=err)
    typer.echo((result.out / SUMMARY_MD).read_text(encoding="utf-8"))  # Markdown as is, not rewrapped
    console.print(
        f"{result.new_records} new records ({result.resumed_records} already done), "
        f"{result.model_calls} LLM calls to the model; results in {result.out}"
    )


@app.command()
def locomo(
    data: Path = DATA,
    out: Path = OUT,
    config: Optional[Path] = CONFIG,
    set_: Optional[list[str]] = SET,
    systems: str = SYSTEMS_OPTION,
    conversations: Optional[str] = typer.Option(None, "--conversations", help="Sample ids, e.g. conv-26,conv-30 (default: all)."),
    limit: Optional[int] = LIMIT,
    max_sessions: Optional[int] = MAX_SESSIONS,
    retrieval_only: bool = RETRIEVAL_ONLY,
    retry_failed: bool = RETRY_FAILED,
    k: Optional[str] = K,
    mcs: Optional[str] = MCS,
    include_adversarial: bool = typer.Option(False, "--include-adversarial", help="Also category 5 (scored by the official F1 rule, not judged)."),
    context_budget: int = BUDGET,
    recall_k: str = RECALL_K,
    batch_size: int = BATCH,
    stores: Optional[Path] = STORES,
    llm_cache: Optional[Path] = CACHE,
) -> None:
    """Run the LoCoMo protocol: curate, answer, judge, report (paper Table 1, appendix D, §5)."""
    _run(
        "locomo", data=data, out=out, config=config, overrides=_overrides(set_), systems=_names(systems),
        conversations=_names(conversations), limit=limit, max_sessions=max_sessions, retrieval_only=retrieval_only,
        retry_failed=retry_failed, ks=_ints(k, "--k"), mcs=_ints(mcs, "--mcs"), include_adversarial=include_adversarial,
        rag_budget=context_budget, recall_ks=_ints(recall_k, "--recall-k"), batch_size=batch_size,
        stores=stores, llm_cache=llm_cache,
    )


@app.command()
def longmemeval(
    data: Path = DATA,
    out: Path = OUT,
    config: Optional[Path] = CONFIG,
    set_: Optional[list[str]] = SET,
    systems: str = SYSTEMS_OPTION,
    questions: Optional[str] = typer.Option(None, "--questions", help="Question ids (default: all)."),
    limit: Optional[int] = LIMIT,
    max_sessions: Optional[int] = MAX_SESSIONS,
    retrieval_only: bool = RETRIEVAL_ONLY,
    retry_failed: bool = RETRY_FAILED,
    k: Optional[str] = K,
    mcs: Optional[str] = MCS,
    context_budget: int = BUDGET,
    recall_k: str = RECALL_K,
    batch_size: int = BATCH,
    stores: Optional[Path] = STORES,
    llm_cache: Optional[Path] = CACHE,
) -> None:
    """Run LongMemEval (one store per question's history; per-type judge prompts; session recall)."""
    _run(
        "longmemeval", data=data, out=out, config=config, overrides=_overrides(set_), systems=_names(systems),
        conversations=_names(questions), limit=limit, max_sessions=max_sessions, retrieval_only=retrieval_only,
        retry_failed=retry_failed, ks=_ints(k, "--k"), mcs=_ints(mcs, "--mcs"), rag_budget=context_budget,
        recall_ks=_ints(recall_k, "--recall-k"), batch_size=batch_size, stores=stores, llm_cache=llm_cache,
    )


@app.command()
def report(out: Path = typer.Argument(..., help="A results folder with summary.json.")) -> None:
    """Redraw summary.md, summary.csv and the plots from a folder's summary.json."""
    from hybridmem_local.eval.report import MANIFEST, SUMMARY_JSON, write_report

    try:
        summary = json.loads((out / SUMMARY_JSON).read_text(encoding="utf-8"))
        manifest_path = out / MANIFEST
        manifest = json.loads(manifest_path.read_text(encoding="utf-8")) if manifest_path.exists() else None
    except (OSError, json.JSONDecodeError) as exc:
        raise fail(f"cannot read {out / SUMMARY_JSON}: {exc}") from exc
    written = write_report(out, summary, manifest)
    console.print("wrote " + ", ".join(p.name for p in written))
