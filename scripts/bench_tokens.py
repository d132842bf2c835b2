"""Prompt tokens per answer: hybrid retrieval vs the full conversation, on the LoCoMo dev file.

Both prompts are the answer prompt the library sends (``prompts/answer.yaml``: system + user
message with the memory block and the question); only the memory block differs:

* **full-context** — every turn of the conversation under its session's date header, as the
  ``full-context`` system renders it, uncut (the paper's baseline reads the whole history);
* **hybrid** — ``format_context`` of ``HybridMemory.search(question)`` at the paper's budget:
  top-10 episodes and top-20 tuples (default retrieval mode, hybrid RRF).

No curated store of the dev file exists here (curation needs Qwen3-8B on a GPU), so the hybrid
context is *estimated* from curated stand-ins LoCoMo ships: its ``observation`` facts as
tuples (speaker, "observed", fact) and its ``session_summary`` texts as episodes, in two
granularities — one episode per session summary (long: an upper estimate) and one episode per
summary sentence (closer to the paper's several short episodes per session).

Tokens are counted with the SmolLM2 tokenizer (the embedded default answer model; llama.cpp
``vocab_only``, else transformers' GGUF tokenizer) and with two proxies that need no model:
whitespace words and characters / 4. The paper reports 87% fewer tokens; the target is ≥ 90%.

    python scripts/bench_tokens.py --out runs/bench_tokens.json
    python scripts/bench_tokens.py --questions-per-conversation 20        # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from rich.table import Table

# scripts/ is not a package: the imports below (noqa: E402) need its path entry first.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_search import DEFAULT_LOCOMO, console, load_embedder, machine, set_threads, write_json  # noqa: E402

from hybridmem_local.eval.locomo import LocomoConversation, load_locomo  # noqa: E402
from hybridmem_local.prompts import load_prompt  # noqa: E402
from hybridmem_local.schema import EpisodeDraft, TupleDraft, turn_line  # noqa: E402

TARGET_REDUCTION = 0.90
PAPER_REDUCTION = 0.87
_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")


def smollm2_counter() -> tuple[str, Callable[[str], int]] | None:
    """``count_tokens`` of the SmolLM2 tokenizer, or None when neither loader is available."""
    from hybridmem_local.weights.resolve import resolve_model

    path = resolve_model("smollm2-135m-instruct").path
    gguf = path if path.suffix == ".gguf" else next(path.glob("*.gguf"))
    try:
        from llama_cpp import Llama

        vocab = Llama(model_path=str(gguf), vocab_only=True, verbose=False)
        return "SmolLM2 (llama.cpp vocab_only)", lambda text: len(
            vocab.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        )
    except Exception as exc:  # missing or broken llama.cpp: try transformers
        console.print(f"[yellow]llama.cpp tokenizer unavailable ({exc}); trying transformers[/]")
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        return "SmolLM2 (transformers GGUF)", lambda text: len(tokenizer.encode(text, add_special_tokens=False))
    except Exception as exc:
        console.print(f"[yellow]no SmolLM2 tokenizer ({exc}); reporting proxies only[/]")
        return None


COUNTERS: dict[str, Callable[[str], int]] = {
    "whitespace words": lambda text: len(text.split()),
    "characters / 4": lambda text: len(text) // 4,
}


def full_context(conversation: LocomoConversation) -> str:
    from hybridmem_local.eval.systems import session_header

    lines = []
    for session in sorted(conversation.sessions, key=lambda s: s.started_at):
        lines.append(session_header(session.started_at))
        lines.extend(turn_line(turn) for turn in session.turns)
    return "\n".join(lines)


def stand_ins(
    raw: dict, conversation: LocomoConversation, granularity: str
) -> tuple[list[EpisodeDraft], list[TupleDraft]]:
    episodes, tuples = [], []
    for session in conversation.sessions:
        number = session.session_id.rsplit("_", 1)[-1]
        day = f"{session.started_at:%Y-%m-%d}"
        summary = raw.get("session_summary", {}).get(f"session_{number}_summary", "")
        parts = [summary] if granularity == "session" else [s for s in _SENTENCE.split(summary) if s.strip()]
        for i, part in enumerate(p for p in parts if p.strip()):
            episodes.append(
                EpisodeDraft(
                    title=f"Session {number}" + ("" if granularity == "session" else f" part {i + 1}"),
                    summary=part.split(". ")[0][:200],
                    details=part,
                    timestamp=day,
                )
            )
        for speaker, facts in raw.get("observation", {}).get(f"session_{number}_observation", {}).items():
            for fact, _ in facts:
                tuples.append(TupleDraft(entity=speaker, relation="observed", object=fact, timestamp=day))
    return episodes, tuples


def prompt_text(memories: str, question: str) -> str:
    messages = load_prompt("answer").messages(memories=memories, question=question, question_date_line="")
    return "\n".join(m.content for m in messages)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--locomo", type=Path, default=DEFAULT_LOCOMO)
    parser.add_argument("--questions-per-conversation", type=int, default=None, help="a random sample (default: all)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    from hybridmem_local.answering.context import format_context
    from hybridmem_local.memory import HybridMemory

    info = machine()
    set_threads(args.threads)
    smol = smollm2_counter()
    counters = dict(COUNTERS)
    if smol is not None:
        counters = {smol[0]: smol[1], **counters}
    headline = next(iter(counters))
    dataset = load_locomo(args.locomo)
    raw = {sample["sample_id"]: sample for sample in json.loads(args.locomo.read_text())}
    embedder = load_embedder()
    rng = random.Random(0)

    systems = ("full-context", "hybrid (episode per session summary)", "hybrid (episode per summary sentence)")
    tokens: dict[str, dict[str, list[int]]] = {s: {c: [] for c in counters} for s in systems}
    per_conversation = []
    with tempfile.TemporaryDirectory() as folder:
        stores = {}
        for granularity, system in (("session", systems[1]), ("sentence", systems[2])):
            memory = HybridMemory.open(Path(folder) / f"{granularity}.db", embedder=embedder)
            for conversation in dataset.conversations:
                episodes, tuples = stand_ins(raw[conversation.sample_id], conversation, granularity)
                memory.add_memories(conversation.namespace, episodes=episodes, tuples=tuples)
            stores[system] = memory
        for conversation in dataset.conversations:
            questions = conversation.questions
            if args.questions_per_conversation:
                questions = rng.sample(questions, min(args.questions_per_conversation, len(questions)))
            whole = full_context(conversation)
            row = {
                "conversation": conversation.sample_id,
                "questions": len(questions),
                "sessions": len(conversation.sessions),
                "turns": sum(len(s.turns) for s in conversation.sessions),
            }
            for question in questions:
                prompts = {systems[0]: prompt_text(whole, question.question)}
                for system, memory in stores.items():
                    result = memory.search(question.question, namespace=conversation.namespace)
                    prompts[system] = prompt_text(format_context(result).text, question.question)
                for system, text in prompts.items():
                    for name, count in counters.items():
                        tokens[system][name].append(count(text))
            row["full_context_tokens"] = tokens[systems[0]][headline][-1] if questions else 0
            per_conversation.append(row)
        for memory in stores.values():
            memory.close()

    means = {s: {c: statistics.fmean(v) for c, v in by.items()} for s, by in tokens.items()}
    reductions = {s: {c: 1 - means[s][c] / means[systems[0]][c] for c in counters} for s in systems[1:]}
    info["load_average_at_end"] = os.getloadavg()
    results = {
        "machine": info,
        "counters": list(counters),
        "headline_counter": headline,
        "questions": len(tokens[systems[0]][headline]),
        "mean_prompt_tokens": means,
        "reduction": reductions,
        "target_reduction": TARGET_REDUCTION,
        "paper_reduction": PAPER_REDUCTION,
        "per_conversation": per_conversation,
        "stand_ins": "LoCoMo session_summary (episodes) and observation (tuples); no curated store exists here",
    }
    table = Table(
        title=f"Answer-prompt tokens per question · {results['questions']} LoCoMo dev questions · "
        "hybrid context estimated from LoCoMo's summaries/observations"
    )
    table.add_column("system")
    for name in counters:
        table.add_column(f"{name}: mean", justify="right")
        table.add_column("fewer", justify="right")
    for system in systems:
        cells = []
        for name in counters:
            cells.append(f"{means[system][name]:,.0f}")
            cells.append("-" if system == systems[0] else f"{100 * reductions[system][name]:.1f}%")
        table.add_row(system, *cells)
    table.caption = f"target ≥ {100 * TARGET_REDUCTION:.0f}% fewer (paper: {100 * PAPER_REDUCTION:.0f}%)"
    console.print(table)
    write_json(args.out, results)


if __name__ == "__main__":
    main()
