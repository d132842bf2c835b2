"""The selected part of a benchmark file as benchmark-neutral records (``systems.EvalConversation``)."""

from __future__ import annotations

from typing import Any

from hybridmem_local.errors import DatasetError
from hybridmem_local.eval.audited_gold import apply_audit, load_audit
from hybridmem_local.eval.locomo import LocomoDataset, load_locomo
from hybridmem_local.eval.longmemeval import LongMemEvalDataset, load_longmemeval
from hybridmem_local.eval.options import RunOptions
from hybridmem_local.eval.sampling import stratified_sample
from hybridmem_local.eval.systems import EvalConversation, EvalQuestion
from hybridmem_local.schema import StrictModel


class LoadedBenchmark(StrictModel):
    conversations: list[EvalConversation]
    #: The loader's counts for the selected data (malformed evidence, skipped sessions...).
    counts: dict[str, Any]


def load_benchmark(options: RunOptions) -> LoadedBenchmark:
    """The selected conversations as benchmark-neutral records; unknown ids are an error."""
    dataset: LocomoDataset | LongMemEvalDataset
    if options.benchmark == "locomo":
        dataset = load_locomo(options.data, include_adversarial=options.include_adversarial)
        conversations = [_from_locomo(c) for c in dataset.conversations]
    else:
        dataset = load_longmemeval(options.data)
        conversations = [_from_longmemeval(i) for i in dataset.instances]
    if options.sample is not None:
        chosen = stratified_sample(conversations, options.sample, options.sample_seed)
        conversations = [
            c.model_copy(update={"questions": [q for q in c.questions if q.question_id in chosen]})
            for c in conversations
        ]
    if options.conversations:
        known = {c.conversation_id for c in conversations}
        unknown = [c for c in options.conversations if c not in known]
        if unknown:
            sample = ", ".join(sorted(known)[:10])
            raise DatasetError(f"{options.data}: no conversation {unknown} (the file has {sample}...)")
        wanted = set(options.conversations)
        conversations = [c for c in conversations if c.conversation_id in wanted]
    beyond_max_sessions = 0
    if options.max_sessions:
        # A question whose evidence lies in a session that is not ingested cannot be answered
        # from memory: it is left out (and counted) before --limit picks the first questions.
        trimmed = []
        for c in conversations:
            sessions = c.sessions[: options.max_sessions]
            stored = {t.turn_id for s in sessions for t in s.turns}
            questions = [q for q in c.questions if set(q.evidence) <= stored]
            beyond_max_sessions += len(c.questions) - len(questions)
            trimmed.append(c.model_copy(update={"sessions": sessions, "questions": questions}))
        conversations = trimmed
    if options.benchmark == "longmemeval" and options.limit:
        conversations = conversations[: options.limit]
    elif options.limit:
        conversations = [c.model_copy(update={"questions": c.questions[: options.limit]}) for c in conversations]
    selected = {q.question_id for c in conversations for q in c.questions}
    audited_answers = None
    if options.audited_gold is not None:
        audited_answers = apply_audit(conversations, load_audit(options.audited_gold), options.audited_gold)
    if isinstance(dataset, LocomoDataset):
        issues = [i for i in dataset.evidence_issues if i.question_id in selected]
        counts: dict[str, Any] = {
            "malformed_evidence": {
                kind: sum(1 for i in issues if i.kind == kind)
                for kind in ("split", "repaired", "unresolvable", "dangling")
            },
            "empty_sessions_skipped_in_file": dataset.empty_sessions_skipped,
            "empty_turns_skipped_in_file": dataset.empty_turns_skipped,
        }
    else:
        counts = {
            "empty_sessions_skipped_in_file": dataset.empty_sessions_skipped,
            "empty_turns_skipped_in_file": dataset.empty_turns_skipped,
            "duplicate_sessions_skipped_in_file": dataset.duplicate_sessions_skipped,
        }
    counts["questions_beyond_max_sessions"] = beyond_max_sessions
    counts["questions_with_audited_answer"] = audited_answers
    counts["questions_without_evidence"] = sum(1 for c in conversations for q in c.questions if not q.evidence)
    return LoadedBenchmark(conversations=conversations, counts=counts)


def _from_locomo(conversation) -> EvalConversation:
    return EvalConversation(
        conversation_id=conversation.sample_id,
        namespace=conversation.namespace,
        sessions=conversation.sessions,
        questions=[
            EvalQuestion(
                question_id=q.question_id,
                question=q.question,
                gold=q.answer,
                category=q.category_name,
                category_number=q.category,
                adversarial_answer=q.adversarial_answer,
                evidence=q.evidence,
            )
            for q in conversation.questions
        ],
    )


def _from_longmemeval(instance) -> EvalConversation:
    return EvalConversation(
        conversation_id=instance.question_id,
        namespace=instance.namespace,
        sessions=instance.sessions,
        questions=[
            EvalQuestion(
                question_id=instance.question_id,
                question=instance.question,
                gold=instance.answer,
                category=instance.question_type,
                abstention=instance.is_abstention,
                evidence=instance.evidence_turn_ids,
                answer_session_ids=instance.answer_session_ids,
                question_date=instance.question_date,
            )
        ],
    )
