"""The evaluation runner: a benchmark, a config and a list of systems in; a results folder out.

    options = RunOptions(benchmark="locomo", data=Path("locomo10.json"), out=Path("runs/eval"))
    result = run_evaluation(options, load_config("configs/vllm-offline.yaml"))
    result.summary["systems"]["hybrid"]["overall"]["judge_accuracy"]

For each conversation (a LoCoMo sample, a LongMemEval instance):

1. **Store**: its sessions go into ``STORES/<namespace>.db`` as raw turns, then every pending
   session is curated in batches (``HybridMemory.curate_pending``) when a system needs
   memories. All memory systems share this one curated store; ``hybrid+consolidation``
   works on a copy consolidated after ingest (``STORES/<namespace>.consolidated-mcsN.db``,
   one per min_cluster_size), so curation runs once per conversation.
2. **Questions**, per system, in batches of ``batch_size``: the system builds each context
   (``systems.py``), one batched LLM call answers them all (``answerer.answer_many``, in
   ``answering.mode``), one batched call judges them (``judging.py``: against LoCoMo's gold and,
   with ``--audited-gold``, the audited one), and the metrics are computed (``records.py``).
   Each batch is appended to ``predictions.jsonl`` as soon as it is done. Options live in
   ``options.py``, the LLMs in ``llms.py``, LLM accounting in ``accounting.py``.
3. **Judge audit**: the judge grades planted wrong answers and reworded gold answers
   (``judge_audit.py``) into ``judge_audit.jsonl``; the summary gives its false-accept and
   false-reject rates.
4. **Report**: ``summary.json`` and ``manifest.json`` (``report.py``), ``summary.md``,
   ``summary.csv`` and plots (``render.py``). A study of several such folders, one per
   conversation, is combined by ``shards.py``.

Resuming: a question already in ``predictions.jsonl`` under the same run key (config hash,
system variant, prompt versions, options that change results) is skipped, and every LLM call
goes through one on-disk cache (``llm_cache.sqlite``), so a killed run continues where it
stopped and a finished run re-runs with no model call at all. With ``checkpoints``, each store's
memories are also written into ``OUT/memories/`` as they are made (``checkpoints.py``, no turns)
and a missing store is rebuilt from them: a results folder carried to another machine resumes
without its stores or LLM cache. Automatic consolidation
(``consolidation.every_n_sessions``) is switched off in evaluation stores: the paper's hybrid
system is evaluated unconsolidated and ``hybrid+consolidation`` consolidates once, after ingest.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from hybridmem_local.answering.answerer import Answer, answer_many, build_answer_request, citer_for
from hybridmem_local.answering.context import RenderedContext
from hybridmem_local.config import Config
from hybridmem_local.curation.curator import TEMPLATE_ALLOWANCE_TOKENS
from hybridmem_local.errors import ConfigError, DatasetError, InvalidInputError
from hybridmem_local.eval.accounting import PHASES, MeteredLLM, PhaseUsage
from hybridmem_local.eval.benchmarks import load_benchmark
from hybridmem_local.eval.checkpoints import (
    checkpoint_path,
    read_checkpoint,
    rebuild_store,
    remove_store,
    session_lines,
    write_checkpoint,
)
from hybridmem_local.eval.judging import Judging
from hybridmem_local.eval.llms import Models
from hybridmem_local.eval.options import RunOptions, SystemRun, system_runs
from hybridmem_local.eval.records import (
    PREDICTIONS,
    USAGE,
    QuestionRecord,
    Verdict,
    append_jsonl,
    question_metrics,
    read_records,
)
from hybridmem_local.eval.systems import (
    SYSTEMS,
    EvalConversation,
    EvalQuestion,
    FullContextSystem,
    RetrievalSystem,
    SystemContext,
    SystemSettings,
    build_system,
)
from hybridmem_local.prompts import load_prompt, prompt_names
from hybridmem_local.schema import StrictModel

if TYPE_CHECKING:
    from collections.abc import Callable

    from hybridmem_local.embedding import Embedder
    from hybridmem_local.memory import HybridMemory

log = logging.getLogger(__name__)

#: Below this many tokens for the context, answering would be pointless: a config error.
MIN_CONTEXT_TOKENS = 64
#: Beside a consolidated copy of a store: the curated store's counts it was made from and its report.
CONSOLIDATION_MARKER = ".consolidation.json"


# --------------------------------------------------------------------------- the run


class RunResult(StrictModel):
    out: Path
    summary: dict[str, Any]
    #: This invocation's LLM use per phase (the summary's cost sums every invocation).
    usage: dict[str, PhaseUsage]
    new_records: int
    #: Questions skipped because ``predictions.jsonl`` already held them.
    resumed_records: int

    @property
    def model_calls(self) -> int:
        return sum(u.model_calls for u in self.usage.values())


def config_hash(config: Config) -> str:
    return hashlib.sha256(config.model_dump_json().encode("utf-8")).hexdigest()[:16]


def evaluation_config(config: Config) -> Config:
    """The config the stores are opened with: no automatic consolidation (see module doc)."""
    config = config.model_copy(deep=True)
    config.consolidation.every_n_sessions = 0
    return config


def run_evaluation(options: RunOptions, config: Config, console: Console | None = None) -> RunResult:
    """Run the evaluation ``options`` describe; see the module docstring."""
    return _Run(options, evaluation_config(config), console or Console(stderr=True)).run()


class _Run:
    def __init__(self, options: RunOptions, config: Config, console: Console):
        self.options = options
        self.config = config
        self.console = console
        self.usage: dict[str, PhaseUsage] = {phase: PhaseUsage() for phase in PHASES}
        self.models = Models(config, options.cache_path)
        self.config_hash = config_hash(config)
        self.runs = system_runs(options, config)
        self.keys = {run.label: self._run_key(run) for run in self.runs}
        # What the stores' memories depend on: a checkpoint made under another key is not used.
        self.checkpoint_key = hashlib.sha256(
            json.dumps([self.config_hash, [load_prompt(name).version for name in prompt_names()]]).encode("utf-8")
        ).hexdigest()[:16]
        self.started = datetime.now(timezone.utc)
        self.skipped: dict[str, list[str]] = {}
        self.consolidation: dict[str, list[dict]] = {}
        self.curation_failed: dict[str, int] = {}
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )
        self._embedder: Embedder | None = None
        self.judging = Judging(
            options,
            config,
            self.config_hash,
            self.models,
            console,
            self._record_usage,
        )

    # ------------------------------------------------------------------ top level

    def run(self) -> RunResult:
        from hybridmem_local.eval import render, report

        options = self.options
        options.out.mkdir(parents=True, exist_ok=True)
        options.stores_dir.mkdir(parents=True, exist_ok=True)
        benchmark = load_benchmark(options)
        if not benchmark.conversations:
            raise DatasetError(f"{options.data}: no conversation selected")
        predictions = options.out / PREDICTIONS
        done = {(r.get("run_key"), r.get("question_id")) for r in read_records(predictions)}
        resumed = sum(
            (self.keys[run.label], q.question_id) in done
            for run in self.runs
            for c in benchmark.conversations
            for q in c.questions
        )
        new = 0
        try:
            conversations_task = self.progress.add_task("conversations", total=len(benchmark.conversations))
            for conversation in benchmark.conversations:
                new += self._conversation(conversation, done, predictions)
                self.progress.advance(conversations_task)
            audit = (
                None
                if options.retrieval_only or not (options.judge_audit or options.judge_rewordings)
                else self.judging.audit(benchmark.conversations)
            )
        finally:
            self.models.close()
        records = [
            r
            for r in read_records(predictions)
            if r.get("run_key") in set(self.keys.values())
            and r.get("question_id") in {q.question_id for c in benchmark.conversations for q in c.questions}
        ]
        summary = report.build_summary(
            records=records,
            runs=[{**run.model_dump(), "run_key": self.keys[run.label]} for run in self.runs],
            benchmark=options.benchmark,
            recall_ks=options.recall_ks,
            retrieval_only=options.retrieval_only,
            cost=report.cost_summary(read_records(options.out / USAGE), self.config_hash, benchmark.conversations),
            counts={
                **benchmark.counts,
                "conversations": len(benchmark.conversations),
                "questions": sum(len(c.questions) for c in benchmark.conversations),
                "sessions": sum(len(c.sessions) for c in benchmark.conversations),
                "curation_failed_sessions": sum(self.curation_failed.values()),
                "skipped": self.skipped,
            },
            consolidation=self.consolidation,
            options=options.model_dump(mode="json", exclude={"command"}),
            judge_audit=audit,
        )
        manifest = report.build_manifest(
            self.config,
            self.config_hash,
            options.command,
            self.models.judge_model_id(),
            self.started,
            embedder_model_id=self._embedder.model_id if self._embedder is not None else None,
        )
        render.write_report(options.out, summary, manifest)
        return RunResult(out=options.out, summary=summary, usage=self.usage, new_records=new, resumed_records=resumed)

    def _run_key(self, run: SystemRun) -> str:
        options = self.options
        material = {
            "config": self.config_hash,
            "run": run.model_dump(),
            "prompts": [load_prompt(name).version for name in prompt_names()],
            "retrieval_only": options.retrieval_only,
            "max_sessions": options.max_sessions,
            "rag_budget": options.rag_budget,
            "recall_ks": options.recall_ks,
            "audited_gold": options.audited_gold is not None,
            "judge_prompt": options.judge_prompt,
        }
        return hashlib.sha256(json.dumps(material, sort_keys=True).encode("utf-8")).hexdigest()[:16]

    @property
    def embedder(self) -> Embedder:
        if self._embedder is None:
            from hybridmem_local.embedding import build_embedder

            self._embedder = build_embedder(self.config.embedder)
        return self._embedder

    def _record_usage(self, phase: str, scope: PhaseUsage, conversation_id: str, system: str | None = None) -> None:
        self.usage[phase].add(scope)
        # On disk at once, as predictions are: a run killed later (a machine handed back) keeps
        # what its finished phases cost, and the resumed run adds only what it does itself.
        row = {
            "config_hash": self.config_hash,
            "started_at": self.started.isoformat(),
            "phase": phase,
            "conversation_id": conversation_id,
            "system": system,
            **scope.model_dump(),
        }
        append_jsonl(self.options.out / USAGE, [row])

    # ------------------------------------------------------------------ one conversation

    def _conversation(self, conversation: EvalConversation, done: set, predictions: Path) -> int:
        from hybridmem_local.memory import HybridMemory

        needs = {SYSTEMS[run.system].needs for run in self.runs}
        path = self.options.stores_dir / f"{conversation.namespace}.db"
        curation = PhaseUsage()

        def open_store(at: Path) -> HybridMemory:
            return HybridMemory.open(
                at, self.config, embedder=self.embedder, llm=MeteredLLM(self.models.answer, curation)
            )

        new_store = not path.exists()
        memory = open_store(path)
        opened: list[HybridMemory] = [memory]
        written = 0
        try:
            memory.ingest(conversation.sessions, curate=False)
            if new_store and self.options.checkpoints:
                opened[0] = memory = self._restore(memory, path, conversation, open_store)
            selected = {s.session_id for s in conversation.sessions}
            extra = [
                r.session.session_id
                for r in memory.sessions(conversation.namespace)
                if r.session.session_id not in selected
            ]
            if extra:
                log.warning(
                    "%s: the store %s also holds %d sessions outside this selection (an earlier run with "
                    "more --max-sessions?); they are searched too",
                    conversation.conversation_id,
                    path,
                    len(extra),
                )
            curated = self._curate(memory, path, conversation, curation, wanted=bool(needs - {"raw"}))
            if self.options.checkpoints and not self.options.retrieval_only:
                self._checkpoint(memory, namespace=conversation.namespace, store=path)
            for run in self.runs:
                key = self.keys[run.label]
                pending = [q for q in conversation.questions if (key, q.question_id) not in done]
                if not pending:
                    if SYSTEMS[run.system].needs == "consolidated" and curated:
                        # Answered by an earlier invocation: its compression still belongs in this report.
                        self._note_consolidation(run, conversation, memory.stats(conversation.namespace).counts)
                    continue
                system_memory = self._memory_for(run, memory, conversation, curated, opened)
                if system_memory is None:
                    self.skipped.setdefault(run.label, []).append(conversation.conversation_id)
                    continue
                written += self._questions(run, key, conversation, pending, system_memory, predictions)
        finally:
            for m in opened:
                m.close()
        return written

    def _curate(
        self, memory: HybridMemory, store: Path, conversation: EvalConversation, usage: PhaseUsage, wanted: bool
    ) -> bool:
        """Curate pending sessions when a system needs memories (checkpointing each batch, with
        ``checkpoints``); True when none is left pending."""
        namespace = conversation.namespace
        retry = self.options.retry_failed and not self.options.retrieval_only
        statuses = ["pending"] + (["curation_failed"] if retry else [])
        pending = [r for status in statuses for r in memory.sessions(namespace, status)]
        if pending and wanted and not self.options.retrieval_only:
            task = self.progress.add_task(f"curating {namespace}", total=len(pending))
            total, done_before, since = PhaseUsage(), 0, time.perf_counter()

            def batch_curated(done: int, count: int) -> None:
                # Each batch's cost (and, with checkpoints, its memories) on disk as it ends: a
                # run killed during a long curation keeps what the finished batches made and cost.
                nonlocal done_before, since
                self.progress.update(task, completed=done, total=count)
                now = time.perf_counter()
                usage.wall_s, usage.units = now - since, done - done_before
                done_before, since = done, now
                batch = usage.take()
                total.add(batch)
                self._record_usage("curation", batch, conversation.conversation_id)
                if self.options.checkpoints:
                    self._checkpoint(memory, namespace=namespace, store=store)

            with self.progress:
                memory.curate_pending(namespace, retry_failed=retry, on_progress=batch_curated)
            self.progress.remove_task(task)
            pending = memory.sessions(namespace, "pending")
            self.console.print(
                f"{conversation.conversation_id}: curated {total.units} sessions with {total.requests} LLM requests "
                f"({total.model_calls} to the model) in {total.wall_s:.0f}s"
            )
        self.curation_failed[conversation.conversation_id] = len(memory.sessions(namespace, "curation_failed"))
        return not pending

    def _memory_for(
        self, run: SystemRun, memory: HybridMemory, conversation: EvalConversation, curated: bool, opened: list
    ) -> HybridMemory | None:
        """The store a variant reads, or None when it cannot run here (and why is logged)."""
        needs = SYSTEMS[run.system].needs
        if needs == "raw":
            return memory
        if not curated:
            log.warning(
                "%s: %s skipped: the store has uncurated sessions (--retrieval-only does not curate)",
                conversation.conversation_id,
                run.label,
            )
            return None
        if needs == "curated":
            return memory
        return self._consolidated(run, memory, conversation, opened)

    def _consolidated(
        self, run: SystemRun, memory: HybridMemory, conversation: EvalConversation, opened: list
    ) -> HybridMemory | None:
        """A copy of the curated store consolidated at ``run.mcs``, made once and reused while the
        curated store stays as it was (its counts are kept beside the copy)."""
        from hybridmem_local.memory import HybridMemory

        namespace = conversation.namespace
        path = self._consolidated_path(run, conversation)
        marker = Path(str(path) + CONSOLIDATION_MARKER)
        if run.mcs is None:
            raise InvalidInputError(f"{run.label}: a consolidated system's run needs its min_cluster_size (mcs)")
        config = self.config.model_copy(deep=True)
        config.consolidation.hdbscan.min_cluster_size = run.mcs
        usage = PhaseUsage()
        base = memory.stats(namespace).counts  # what curation stored; changes when it stores more
        made_from = json.loads(marker.read_text(encoding="utf-8"))["base"] if marker.exists() else None
        if made_from != base:
            if self.options.retrieval_only:
                log.warning(
                    "%s: %s skipped: no consolidated store yet (--retrieval-only does not consolidate)",
                    conversation.conversation_id,
                    run.label,
                )
                return None
            checkpoint = (
                read_checkpoint(checkpoint_path(self.options.out, path), self.checkpoint_key)
                if self.options.checkpoints
                else None
            )
            if checkpoint is not None and checkpoint.header.get("base") == base:
                rebuild_store(
                    path,
                    lambda at: HybridMemory.open(at, config, embedder=self.embedder),
                    session_lines(memory, namespace),
                    checkpoint,
                )
                made = {"base": base, "report": checkpoint.header["report"]}
                self.console.print(
                    f"{conversation.conversation_id}: consolidated copy (mcs {run.mcs}) rebuilt from its checkpoint"
                )
            else:
                copy_store(memory, path)
                started = time.perf_counter()
                with HybridMemory.open(path, config, embedder=self.embedder) as copy:
                    report = copy.consolidate(namespace, llm=MeteredLLM(self.models.answer, usage))
                usage.wall_s = time.perf_counter() - started
                usage.units = len(conversation.sessions)
                self._record_usage("consolidation", usage, conversation.conversation_id, f"mcs{run.mcs}")
                made = {"base": base, "report": report.model_dump(mode="json")}
                self.console.print(
                    f"{conversation.conversation_id}: consolidated (mcs {run.mcs}) {report.memories_before} → "
                    f"{report.memories_after} memories ({report.compression_pct:.1f}% compression) in "
                    f"{usage.wall_s:.0f}s"
                )
            marker.write_text(json.dumps(made), encoding="utf-8")
        self._note_consolidation(run, conversation, base)
        copy = HybridMemory.open(path, config, embedder=self.embedder)
        opened.append(copy)
        if self.options.checkpoints:
            self._checkpoint(copy, namespace=namespace, store=path, **json.loads(marker.read_text(encoding="utf-8")))
        return copy

    def _restore(
        self,
        memory: HybridMemory,
        path: Path,
        conversation: EvalConversation,
        open_store: Callable[[Path], HybridMemory],
    ) -> HybridMemory:
        """The new store ``memory`` (its sessions just stored) rebuilt from the conversation's
        checkpoint when the results folder has one; ``memory`` itself otherwise."""
        checkpoint = read_checkpoint(checkpoint_path(self.options.out, path), self.checkpoint_key)
        if checkpoint is None:
            return memory
        sessions = session_lines(memory, conversation.namespace)
        memory.close()
        counts = rebuild_store(path, open_store, sessions, checkpoint)
        rebuilt = open_store(path)
        pending = len(rebuilt.sessions(conversation.namespace, "pending"))
        self.console.print(
            f"{conversation.conversation_id}: store rebuilt from its checkpoint: {counts['memories']} memories, "
            f"{counts['sessions'] - pending} of {counts['sessions']} sessions curated"
        )
        return rebuilt

    def _checkpoint(self, memory: HybridMemory, namespace: str, store: Path, **header: Any) -> None:
        write_checkpoint(memory, namespace, checkpoint_path(self.options.out, store), self.checkpoint_key, **header)

    def _consolidated_path(self, run: SystemRun, conversation: EvalConversation) -> Path:
        return self.options.stores_dir / f"{conversation.namespace}.consolidated-mcs{run.mcs}.db"

    def _note_consolidation(self, run: SystemRun, conversation: EvalConversation, base: dict[str, int]) -> None:
        """Report the compression of the consolidated copy made from the curated store whose counts
        are ``base`` (the counts kept beside the copy, or in its checkpoint when the copy is not on
        this machine); nothing when there is no such copy."""
        from hybridmem_local.results import ConsolidationReport

        path = self._consolidated_path(run, conversation)
        marker = Path(str(path) + CONSOLIDATION_MARKER)
        if marker.exists():
            made = json.loads(marker.read_text(encoding="utf-8"))
        elif self.options.checkpoints and (
            checkpoint := read_checkpoint(checkpoint_path(self.options.out, path), self.checkpoint_key)
        ):
            made = checkpoint.header
        else:
            return
        if made["base"] != base:
            return  # made from a store that has changed since: not what these answers read
        report = ConsolidationReport.model_validate(made["report"])
        entries = self.consolidation.setdefault(f"mcs{run.mcs}", [])
        if not any(e["conversation_id"] == conversation.conversation_id for e in entries):
            entries.append(
                {
                    "conversation_id": conversation.conversation_id,
                    "mcs": run.mcs,
                    "memories_before": report.memories_before,
                    "memories_after": report.memories_after,
                    "clusters": sum(s.clusters for s in report.stores.values()),
                    "llm_requests": report.llm.requests,
                    "merges": sum(s.merges for s in report.stores.values()),
                    "deletions": sum(s.deletions for s in report.stores.values()),
                }
            )

    # ------------------------------------------------------------------ questions of one system

    def _settings(self, run: SystemRun) -> SystemSettings:
        llm = self.models.answer
        return SystemSettings(
            config=self.config,
            count_tokens=llm.count_tokens,
            context_limit=self._context_limit,
            k=run.k,
            recall_depth=max(self.options.recall_ks),
            rag_budget=self.options.rag_budget,
        )

    def _context_limit(self, question: EvalQuestion) -> int:
        """Tokens left for the context once the answer prompt, question and reply fit."""
        llm_config = self.config.llm
        request = build_answer_request(
            question.question,
            RenderedContext(text="", short_ids={}),
            question.question_date,
            llm_config.enable_thinking,
            self.config.answering.mode,
        )
        count = self.models.answer.count_tokens
        overhead = sum(count(m.content) for m in request.messages) + TEMPLATE_ALLOWANCE_TOKENS
        limit = llm_config.context_tokens - overhead - (request.max_new_tokens or llm_config.max_new_tokens)
        if limit < MIN_CONTEXT_TOKENS:
            raise ConfigError(
                f"llm.context_tokens={llm_config.context_tokens} leaves {limit} tokens for the context of question "
                f"{question.question_id} after the answer prompt ({overhead}) and the reply; raise llm.context_tokens"
            )
        return limit

    def _questions(
        self,
        run: SystemRun,
        key: str,
        conversation: EvalConversation,
        pending: list[EvalQuestion],
        memory: HybridMemory,
        predictions: Path,
    ) -> int:
        system = build_system(run.system, self._settings(run))
        system.prepare(conversation, memory)
        retrieval, answering, judging = PhaseUsage(), PhaseUsage(), PhaseUsage()
        answer_llm = MeteredLLM(self.models.answer, answering)
        judge_llm = None if self.options.retrieval_only else MeteredLLM(self.models.judge, judging)
        turn_sessions = conversation.turn_sessions()
        task = self.progress.add_task(f"{conversation.conversation_id} {run.label}", total=len(pending))
        with self.progress:
            for start in range(0, len(pending), self.options.batch_size):
                batch = pending[start : start + self.options.batch_size]
                contexts, seconds = [], []
                began = time.perf_counter()
                for question in batch:
                    t0 = time.perf_counter()
                    contexts.append(system.context(question))
                    seconds.append(time.perf_counter() - t0)
                retrieval.wall_s += time.perf_counter() - began
                retrieval.units += len(batch)
                answers: list[Answer | None] = [None] * len(batch)
                audited: list[Verdict | None] = [None] * len(batch)
                verdicts: list[tuple[Verdict | None, str | None, float | None]] = [(None, None, None)] * len(batch)
                if judge_llm is not None:  # None: retrieval only
                    began = time.perf_counter()
                    answered = answer_many(
                        answer_llm,
                        [q.question for q in batch],
                        [
                            RenderedContext(text=c.text, short_ids=c.short_ids, memory_texts=c.memory_texts)
                            for c in contexts
                        ],
                        [q.question_date for q in batch],
                        enable_thinking=self.config.llm.enable_thinking,
                        tag=conversation.namespace,
                        mode=self.config.answering.mode,
                        citer=citer_for(self.config.answering, self.embedder.embed),
                    )
                    answering.wall_s += time.perf_counter() - began
                    answering.units += len(batch)
                    began = time.perf_counter()
                    answers = list(answered)
                    verdicts = self.judging.verdicts(
                        judge_llm, conversation.namespace, batch, [a.answer for a in answered]
                    )
                    audited = self.judging.audited_verdicts(judge_llm, conversation.namespace, batch, answers, verdicts)
                    judging.wall_s += time.perf_counter() - began
                    judging.units += len(batch)
                records = [
                    self._record(run, key, conversation, q, c, s, a, v, va, system, turn_sessions)
                    for q, c, s, a, v, va in zip(batch, contexts, seconds, answers, verdicts, audited, strict=True)
                ]
                append_jsonl(predictions, records)
                self.progress.advance(task, len(batch))
        self.progress.remove_task(task)
        for phase, scope in (("retrieval", retrieval), ("answering", answering), ("judging", judging)):
            if scope.units:
                self._record_usage(phase, scope, conversation.conversation_id, run.label)
        self.console.print(
            f"{conversation.conversation_id} {run.label}: {len(pending)} questions "
            f"({answering.model_calls} answer and {judging.model_calls} judge calls to the model, "
            f"{retrieval.wall_s + answering.wall_s + judging.wall_s:.0f}s)"
        )
        return len(pending)

    def _record(
        self,
        run: SystemRun,
        key: str,
        conversation: EvalConversation,
        question: EvalQuestion,
        context: SystemContext,
        retrieval_s: float,
        answer: Answer | None,
        judged: tuple[Verdict | None, str | None, float | None],
        verdict_audited: Verdict | None,
        system: RetrievalSystem | FullContextSystem,
        turn_sessions: dict[str, str],
    ) -> QuestionRecord:
        verdict, judge_error, judge_s = judged
        prediction = None if answer is None else answer.answer
        return QuestionRecord(
            run_key=key,
            system=run.label,
            system_name=run.system,
            conversation_id=conversation.conversation_id,
            question_id=question.question_id,
            question=question.question,
            category=question.category,
            gold=question.gold,
            adversarial_answer=question.adversarial_answer,
            evidence=question.evidence,
            prediction=prediction,
            answer_mode=None if answer is None else answer.mode,
            evidence_turns=system.evidence_turns,
            answer_error=None if answer is None else answer.error,
            cited=[] if answer is None else answer.citations,
            cited_memory_ids=[] if answer is None else answer.cited_memory_ids,
            retrieved=context.ranked if system.ranked else [],
            context_turns=len(context.turn_ids),
            context_tokens=context.tokens,
            context_truncated=context.truncated,
            prompt_tokens=None if answer is None else answer.prompt_tokens,
            completion_tokens=None if answer is None else answer.completion_tokens,
            retrieval_s=round(retrieval_s, 4),
            answer_s=None if answer is None else round(answer.latency_s, 4),
            judge_s=None if judge_s is None else round(judge_s, 4),
            verdict=verdict,
            judge_error=judge_error,
            gold_audited=question.gold_audited if question.evidence_audited is not None else None,
            evidence_audited=question.evidence_audited,
            verdict_audited=verdict_audited,
            metrics=question_metrics(
                self.options.benchmark,
                question,
                context,
                prediction,
                verdict,
                system.ranked,
                self.options.recall_ks,
                self.config.retrieval.tuple_multiplier,
                turn_sessions,
                verdict_audited,
            ),
        )


def copy_store(memory: HybridMemory, path: Path) -> None:
    """A consistent copy of ``memory``'s SQLite file at ``path`` (owner-only), replacing any
    earlier copy and its indexes (which rebuild from the copy, vectors from its embedding cache)."""
    remove_store(path)
    memory.backup(path)
