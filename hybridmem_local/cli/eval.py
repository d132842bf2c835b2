"""``hybridmem eval``: benchmark runs and their reports (a typer sub-app mounted by ``cli/main.py``).

hybridmem eval locomo --data locomo10.json --config configs/vllm-offline.yaml --out runs/locomo
hybridmem eval locomo --data locomo10.json --systems hybrid,rag --retrieval-only --out runs/recall
hybridmem eval longmemeval --data longmemeval_s_cleaned.json --limit 50 --out runs/lme
hybridmem eval report runs/locomo          # redraw summary.md/.csv and plots from summary.json
hybridmem eval report docs/results/locomo-dev8   # a study: its tables from every shard's records
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from hybridmem_local.cli.common import ConfigOptions, Output, print_json, with_options
from hybridmem_local.cli.console import console, err
from hybridmem_local.cli.errors import fail, reported
from hybridmem_local.errors import ConfigError, DatasetError
from hybridmem_local.eval import Benchmark
from hybridmem_local.eval.judge import LocomoJudge
from hybridmem_local.eval.judge_audit import DEFAULT_AUDIT_SIZE
from hybridmem_local.eval.systems import DEFAULT_RAG_BUDGET, SYSTEMS

app = typer.Typer(help="Evaluate on LoCoMo / LongMemEval and report.", no_args_is_help=True, add_completion=False)

ALL_SYSTEMS = ",".join(SYSTEMS)

DATA = typer.Option(..., "--data", help="Benchmark file (official JSON format).")
OUT = typer.Option(..., "--out", help="Results folder (created; a rerun resumes it).")
SYSTEMS_OPTION = typer.Option(ALL_SYSTEMS, "--systems", help=f"Comma-separated, from: {ALL_SYSTEMS}.")
LIMIT = typer.Option(None, "--limit", min=1, help="Questions per conversation (LongMemEval: instances).")
MAX_SESSIONS = typer.Option(
    None,
    "--max-sessions",
    min=1,
    help="Ingest only the first N sessions of each conversation (questions about later sessions are left out).",
)
RETRIEVAL_ONLY = typer.Option(False, "--retrieval-only", help="Retrieval metrics only: no curation, answers or judge.")
RETRY_FAILED = typer.Option(
    False, "--retry-failed", help="Curate again sessions whose curation failed in an earlier run."
)
CHECKPOINTS = typer.Option(
    False,
    "--checkpoints",
    help="Write each store's memories (no turns) into OUT/memories/ as they are made, and rebuild a missing "
    "store from them: the results folder alone resumes the run on another machine.",
)
K = typer.Option(None, "--k", help="Retrieval budgets to sweep for the memory systems, e.g. 2,5,10,20.")
MCS = typer.Option(None, "--mcs", help="min_cluster_size values to sweep for hybrid+consolidation, e.g. 2,5,10,20.")
BUDGET = typer.Option(
    DEFAULT_RAG_BUDGET, "--context-budget", min=1, help="The rag baseline's context budget (answer-model tokens)."
)
RECALL_K = typer.Option("2,5,10,20", "--recall-k", help="k values of evidence_recall@k / session_recall@k.")
BATCH = typer.Option(32, "--batch-size", min=1, help="Questions per batched answer/judge call (saved after each).")
JUDGE_AUDIT_OPTION = typer.Option(
    DEFAULT_AUDIT_SIZE,
    "--judge-audit",
    min=0,
    help="Planted wrong answers (other questions' gold answers) the judge grades, for its false-accept rate; 0: none.",
)
SAMPLE = typer.Option(
    None,
    "--sample",
    min=1,
    help="A stratified sample of N questions (by conversation and category) over the whole file, "
    "drawn before --conversations selects, so shards agree.",
)
SAMPLE_SEED = typer.Option(0, "--sample-seed", help="Seed of --sample.")
JUDGE_PROMPT = typer.Option(
    "mem0",
    "--judge-prompt",
    help="LoCoMo judge prompt: mem0 (what papers report; lenient) or strict (the same fact, the same time).",
)
JUDGE_REWORDINGS = typer.Option(
    0,
    "--judge-rewordings",
    min=0,
    help="Gold answers reworded without changing their meaning that the judge grades, for its false-reject rate.",
)
STORES = typer.Option(
    None, "--stores", help="Folder of per-conversation stores (default OUT/stores); share it to reuse curation."
)
CACHE = typer.Option(None, "--llm-cache", help="LLM call cache file (default OUT/llm_cache.sqlite).")


def _ints(value: str | None, option: str) -> list[int] | None:
    if value is None:
        return None
    try:
        return [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        raise typer.BadParameter(f"expected comma-separated integers, got {value!r}", param_hint=option) from None


def _names(value: str | None) -> list[str] | None:
    return None if value is None else [part.strip() for part in value.split(",") if part.strip()]


def _run(benchmark: Benchmark, options: ConfigOptions, output: Output, **kwargs) -> None:
    from hybridmem_local.errors import ModelRegistryError
    from hybridmem_local.eval.options import RunOptions
    from hybridmem_local.eval.report import SUMMARY_MD
    from hybridmem_local.eval.runner import run_evaluation

    config = options.config
    # pydantic's ValidationError (bad options) is a ValueError.
    with reported(ConfigError, DatasetError, ModelRegistryError, ValueError, FileNotFoundError):
        run = RunOptions(benchmark=benchmark, command=sys.argv, **kwargs)
        result = run_evaluation(run, config, console=err)
    if output.as_json:
        print_json(result.summary)
        return
    typer.echo((result.out / SUMMARY_MD).read_text(encoding="utf-8"))  # Markdown as is, not rewrapped
    console.print(
        f"{result.new_records} new records ({result.resumed_records} already done), "
        f"{result.model_calls} LLM calls to the model; results in {result.out}"
    )


@app.command()
@with_options
def locomo(
    data: Path = DATA,
    out: Path = OUT,
    systems: str = SYSTEMS_OPTION,
    conversations: str | None = typer.Option(
        None, "--conversations", help="Sample ids, e.g. conv-26,conv-30 (default: all)."
    ),
    limit: int | None = LIMIT,
    sample: int | None = SAMPLE,
    sample_seed: int = SAMPLE_SEED,
    audited_gold: Path | None = typer.Option(
        None,
        "--audited-gold",
        help="An audit's corrected gold answers and evidence (locomo-audit errors.json): every question is "
        "scored against both golds.",
    ),
    max_sessions: int | None = MAX_SESSIONS,
    retrieval_only: bool = RETRIEVAL_ONLY,
    retry_failed: bool = RETRY_FAILED,
    checkpoints: bool = CHECKPOINTS,
    k: str | None = K,
    mcs: str | None = MCS,
    include_adversarial: bool = typer.Option(
        False, "--include-adversarial", help="Also category 5 (scored by the official F1 rule, not judged)."
    ),
    context_budget: int = BUDGET,
    recall_k: str = RECALL_K,
    batch_size: int = BATCH,
    judge_audit: int = JUDGE_AUDIT_OPTION,
    judge_rewordings: int = JUDGE_REWORDINGS,
    judge_prompt: LocomoJudge = JUDGE_PROMPT,
    stores: Path | None = STORES,
    llm_cache: Path | None = CACHE,
    *,
    options: ConfigOptions,
    output: Output,
) -> None:
    """Run the LoCoMo protocol: curate, answer, judge, report (paper Table 1, appendix D, §5)."""
    _run(
        "locomo",
        options,
        output,
        data=data,
        out=out,
        systems=_names(systems),
        conversations=_names(conversations),
        limit=limit,
        sample=sample,
        sample_seed=sample_seed,
        audited_gold=audited_gold,
        max_sessions=max_sessions,
        retrieval_only=retrieval_only,
        retry_failed=retry_failed,
        checkpoints=checkpoints,
        ks=_ints(k, "--k"),
        mcs=_ints(mcs, "--mcs"),
        include_adversarial=include_adversarial,
        rag_budget=context_budget,
        recall_ks=_ints(recall_k, "--recall-k"),
        batch_size=batch_size,
        judge_audit=judge_audit,
        judge_rewordings=judge_rewordings,
        judge_prompt=judge_prompt,
        stores=stores,
        llm_cache=llm_cache,
    )


@app.command()
@with_options
def longmemeval(
    data: Path = DATA,
    out: Path = OUT,
    systems: str = SYSTEMS_OPTION,
    questions: str | None = typer.Option(None, "--questions", help="Question ids (default: all)."),
    limit: int | None = LIMIT,
    max_sessions: int | None = MAX_SESSIONS,
    retrieval_only: bool = RETRIEVAL_ONLY,
    retry_failed: bool = RETRY_FAILED,
    checkpoints: bool = CHECKPOINTS,
    k: str | None = K,
    mcs: str | None = MCS,
    context_budget: int = BUDGET,
    recall_k: str = RECALL_K,
    batch_size: int = BATCH,
    judge_audit: int = JUDGE_AUDIT_OPTION,
    stores: Path | None = STORES,
    llm_cache: Path | None = CACHE,
    *,
    options: ConfigOptions,
    output: Output,
) -> None:
    """Run LongMemEval (one store per question's history; per-type judge prompts; session recall)."""
    _run(
        "longmemeval",
        options,
        output,
        data=data,
        out=out,
        systems=_names(systems),
        conversations=_names(questions),
        limit=limit,
        max_sessions=max_sessions,
        retrieval_only=retrieval_only,
        retry_failed=retry_failed,
        checkpoints=checkpoints,
        ks=_ints(k, "--k"),
        mcs=_ints(mcs, "--mcs"),
        rag_budget=context_budget,
        recall_ks=_ints(recall_k, "--recall-k"),
        batch_size=batch_size,
        judge_audit=judge_audit,
        stores=stores,
        llm_cache=llm_cache,
    )


@app.command("memory-sample")
@with_options
def memory_sample(
    data: Path = DATA,
    stores: Path = typer.Option(..., "--stores", help="The study's folder of curated per-conversation stores."),
    out: Path = typer.Option(..., "--out", help="JSONL file of sampled memories to label (overwritten)."),
    size: int = typer.Option(100, "--size", min=1, help="Memories to draw, uniformly over all conversations."),
    seed: int = typer.Option(0, "--seed", help="Seed of the draw."),
    *,
    options: ConfigOptions,
) -> None:
    """Draw curated memories at random beside their source turns, for a reviewer to label
    (right, wrong_speaker, invented_detail, wrong_date, not_in_turns); see eval/precision.py."""
    from hybridmem_local.eval.benchmarks import load_benchmark
    from hybridmem_local.eval.options import RunOptions
    from hybridmem_local.eval.precision import draw_memories
    from hybridmem_local.eval.records import append_jsonl
    from hybridmem_local.memory import HybridMemory

    settings = options.config
    with reported(ConfigError, DatasetError, ValueError, FileNotFoundError):
        benchmark = load_benchmark(RunOptions(benchmark="locomo", data=data, out=out.parent))
        memories = {}
        for conversation in benchmark.conversations:
            path = stores / f"{conversation.namespace}.db"
            if path.exists():
                with HybridMemory.open(path, settings) as memory:
                    memories[conversation.conversation_id] = memory.list(conversation.namespace)
        if not memories:
            raise DatasetError(f"{stores}: no store of any conversation of {data}")
        rows = draw_memories(memories, benchmark.conversations, size, seed)
    out.unlink(missing_ok=True)
    append_jsonl(out, rows)
    console.print(f"{len(rows)} memories of {len(memories)} conversations written to {out}")


@app.command()
def report(
    out: Path = typer.Argument(..., help="A results folder with summary.json, or a study folder with shards/."),
) -> None:
    """Redraw summary.md, summary.csv and the plots from a folder's summary.json; for a study
    (a folder with shards/), rebuild its summary from every shard's records first."""
    from hybridmem_local.eval.render import write_report
    from hybridmem_local.eval.report import MANIFEST, SUMMARY_JSON
    from hybridmem_local.eval.shards import combine_shards, shard_folders, unfinished_shards

    if shard_folders(out):
        with reported(DatasetError):
            study, study_manifest = combine_shards(out)
        written = write_report(out, study, study_manifest)
        console.print(f"{len(study['shards'])} shards; wrote " + ", ".join(p.name for p in written))
        unfinished = [folder.name for folder in unfinished_shards(out)]
        if unfinished:
            console.print("left out, not finished (no summary.json): " + ", ".join(unfinished))
        return
    try:
        summary = json.loads((out / SUMMARY_JSON).read_text(encoding="utf-8"))
        manifest_path = out / MANIFEST
        manifest = json.loads(manifest_path.read_text(encoding="utf-8")) if manifest_path.exists() else None
    except (OSError, json.JSONDecodeError) as exc:
        raise fail(f"cannot read {out / SUMMARY_JSON}: {exc}") from exc
    written = write_report(out, summary, manifest)
    console.print("wrote " + ", ".join(p.name for p in written))
