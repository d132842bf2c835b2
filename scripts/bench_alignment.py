"""Provenance alignment on LoCoMo: observation facts aligned to their session, scored against gold.

LoCoMo's ``observation`` facts each name the turns (``dia_id``) they were written from. Here
every fact is given to :func:`hybridmem_local.text.alignment.align` WITHOUT its ids, as a curated
memory whose model cited nothing usable (title = speaker, details = the fact, as the other
benches store them), with its whole session as the candidate turns (a curation window is at
most a session). The turns chosen are compared with the gold ids:

* precision = chosen turns that are gold / chosen turns;
* recall    = gold turns chosen / gold turns;
* hit       = facts with at least one gold turn chosen / facts.

over all facts of all conversations (micro averages), for a grid of lexical weight, turn bound
(``max_turns``) and threshold (``min_score``). Facts whose evidence names no turn of their
session are skipped (counted). No LLM is called; embeddings are MiniLM (the library default).

    python scripts/bench_alignment.py                      # the table (all 8 dev conversations)
    python scripts/bench_alignment.py --out runs/bench_alignment.json
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from hybridmem_local.config import CurationConfig, EmbedderConfig
from hybridmem_local.embedding import build_embedder
from hybridmem_local.eval.locomo import load_locomo, normalise_evidence
from hybridmem_local.schema import EpisodeDraft, Session, turn_line
from hybridmem_local.text.alignment import AlignmentSettings, alignment_scores, content_text, select

REPO = Path(__file__).resolve().parents[1]
DEFAULT_LOCOMO = REPO.parent / "shared" / "data" / "locomo" / "locomo_dev8.json"
LEXICAL_WEIGHTS = (0.0, 0.25, 0.5, 0.75, 1.0)
MAX_TURNS = (1, 2, 3)
MIN_SCORES = (0.4, 0.5, 0.55, 0.6, 0.65, 0.7)


@dataclass
class SessionFacts:
    """One session's turns and its observation facts with their gold turn ids."""

    session: Session
    texts: list[str]
    gold: list[set[str]]


def session_facts(path: Path, conversations: int | None) -> tuple[list[SessionFacts], int]:
    """Every session's facts (and how many facts had no gold turn in their session)."""
    dataset = load_locomo(path)
    raw_samples = {s["sample_id"]: s for s in json.loads(path.read_text(encoding="utf-8"))}
    out, skipped = [], 0
    for conversation in dataset.conversations[:conversations]:
        sessions = {s.session_id.rsplit(":", 1)[1]: s for s in conversation.sessions}
        for key, by_speaker in raw_samples[conversation.sample_id].get("observation", {}).items():
            session = sessions.get(key.removesuffix("_observation"))
            if session is None:
                continue
            turn_ids = {t.turn_id for t in session.turns}
            texts, gold = [], []
            for speaker, entries in by_speaker.items():
                for fact, evidence in entries:
                    raw = [evidence] if isinstance(evidence, str) else list(evidence)
                    kept, _ = normalise_evidence(f"{conversation.sample_id}:{key}", raw, turn_ids)
                    if not kept:
                        skipped += 1
                        continue
                    draft = EpisodeDraft(title=speaker, summary=fact, details=fact, timestamp="2023")
                    texts.append(content_text(draft))
                    gold.append(set(kept))
            if texts:
                out.append(SessionFacts(session, texts, gold))
    return out, skipped


def score(sessions: list[SessionFacts], scores: list[np.ndarray], settings: AlignmentSettings) -> dict[str, float]:
    chosen_n = correct = gold_n = hits = facts = 0
    for item, matrix in zip(sessions, scores, strict=True):
        for row, gold in zip(matrix, item.gold, strict=True):
            chosen = {item.session.turns[i].turn_id for i in select(row, settings)}
            chosen_n += len(chosen)
            correct += len(chosen & gold)
            gold_n += len(gold)
            hits += bool(chosen & gold)
            facts += 1
    return {
        "precision": correct / chosen_n,
        "recall": correct / gold_n,
        "hit": hits / facts,
        "turns_per_fact": chosen_n / facts,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--locomo", type=Path, default=DEFAULT_LOCOMO)
    parser.add_argument("--conversations", type=int, default=None, help="only the first N conversations")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    console = Console()

    started = time.perf_counter()
    sessions, skipped = session_facts(args.locomo, args.conversations)
    embedder = build_embedder(EmbedderConfig(device="cpu"))
    texts = [t for s in sessions for t in s.texts]
    lines = [turn_line(t) for s in sessions for t in s.session.turns]
    vectors = embedder.embed(texts + lines)
    fact_vectors, line_vectors = vectors[: len(texts)], vectors[len(texts) :]
    n_facts = len(texts)
    console.log(
        f"{n_facts} facts in {len(sessions)} sessions ({skipped} without a gold turn skipped); "
        f"embedded in {time.perf_counter() - started:.0f}s"
    )

    rows = []
    for weight in LEXICAL_WEIGHTS:
        scores, f, t = [], 0, 0
        for item in sessions:
            n_f, n_t = len(item.texts), len(item.session.turns)
            scores.append(
                alignment_scores(
                    item.texts,
                    fact_vectors[f : f + n_f],
                    [turn_line(x) for x in item.session.turns],
                    line_vectors[t : t + n_t],
                    weight,
                )
            )
            f, t = f + n_f, t + n_t
        for max_turns in MAX_TURNS:
            for min_score in MIN_SCORES if max_turns > 1 else (1.0,):
                settings = AlignmentSettings(max_turns=max_turns, min_score=min_score, lexical_weight=weight)
                rows.append({**settings.model_dump(), **score(sessions, scores, settings)})

    default = CurationConfig()
    table = Table(title=f"alignment of {n_facts} LoCoMo observation facts to their session's turns (micro averages)")
    for column in ("lexical_weight", "max_turns", "min_score", "precision", "recall", "F1", "hit", "turns/fact"):
        table.add_column(column, justify="right")
    for row in rows:
        f1 = 2 * row["precision"] * row["recall"] / (row["precision"] + row["recall"])
        row["f1"] = f1
        is_default = (row["lexical_weight"], row["max_turns"], row["min_score"]) == (
            default.align_lexical_weight,
            default.align_max_turns,
            default.align_min_score,
        )
        table.add_row(
            f"{row['lexical_weight']:.2f}",
            str(row["max_turns"]),
            "-" if row["max_turns"] == 1 else f"{row['min_score']:.2f}",
            f"{row['precision']:.3f}",
            f"{row['recall']:.3f}",
            f"{f1:.3f}",
            f"{row['hit']:.3f}",
            f"{row['turns_per_fact']:.2f}",
            style="bold" if is_default else None,
        )
    console.print(table)
    console.print("bold: the configured default (curation.align_*)")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"facts": n_facts, "skipped": skipped, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
