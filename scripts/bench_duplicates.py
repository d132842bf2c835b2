"""The near-duplicate threshold of the write-time guard (curation/dedup.py), measured on LoCoMo.

The guard compares a new memory with active memories of the same kind that share its
timestamp or session, by the cosine of their embedded index texts (MiniLM, the default). A
threshold is good when distinct memories almost never reach it while repeats do. Stand-ins,
all from LoCoMo's ``observation`` facts (as episodes: details = the fact, as the other benches
store them):

* **distinct**: every pair of different facts of the same session (they share a timestamp:
  exactly what the guard compares). A pair at or above the threshold would lose a memory
  (the guard also needs equal numbers: that column counts the pairs left); ``facts merged``
  is the share of facts that have such a partner.
* **reworded**: each fact restated the way a small model repeats itself: its subject name
  swapped for a pronoun ("Caroline attended ..." → "She attended ..."), and cut before its last
  comma-clause (only facts that have one).
* **paraphrase**: LoCoMo's ``event_summary`` events, written by other annotators about the
  same sessions: each event's best cosine to the facts of its speaker and session (an upper
  bound on how alike an independent rewording is; some events match no fact).

    python scripts/bench_duplicates.py
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from hybridmem_local.config import CurationConfig, EmbedderConfig
from hybridmem_local.curation.dedup import content_key, numbers
from hybridmem_local.embedding import build_embedder
from hybridmem_local.schema import EpisodeDraft

REPO = Path(__file__).resolve().parents[1]
DEFAULT_LOCOMO = REPO.parent / "shared" / "data" / "locomo" / "locomo_dev8.json"
THRESHOLDS = (0.80, 0.85, 0.88, 0.90, 0.92, 0.94, 0.96, 0.98)
_LAST_CLAUSE = re.compile(r",[^,]*$")


def pronoun_for(fact: str, speaker: str) -> str | None:
    """The fact with its leading subject name as "They", or None when it does not start with it."""
    if not fact.startswith(speaker + " "):
        return None
    return "They" + fact[len(speaker) :]


def cut_last_clause(fact: str) -> str | None:
    cut = _LAST_CLAUSE.sub(".", fact)
    return cut if cut != fact and len(cut.split()) >= 4 else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--locomo", type=Path, default=DEFAULT_LOCOMO)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    console = Console()
    started = time.perf_counter()

    sessions: list[list[tuple[str, str]]] = []  # per session: (speaker, fact)
    events: list[tuple[int, str, str]] = []  # (session index, speaker, event)
    for sample in json.loads(args.locomo.read_text(encoding="utf-8")):
        for key, by_speaker in sample.get("observation", {}).items():
            number = key.removeprefix("session_").removesuffix("_observation")
            facts = [(speaker, fact) for speaker, entries in by_speaker.items() for fact, _ in entries]
            if not facts:
                continue
            sessions.append(facts)
            for speaker, items in sample.get("event_summary", {}).get(f"events_session_{number}", {}).items():
                if speaker != "date":
                    events += [(len(sessions) - 1, speaker, event) for event in items]

    facts = [f for s in sessions for f in s]
    rewrites = {
        "pronoun": [(i, r) for i, (speaker, fact) in enumerate(facts) if (r := pronoun_for(fact, speaker))],
        "last clause cut": [(i, r) for i, (_, fact) in enumerate(facts) if (r := cut_last_clause(fact))],
    }
    embedder = build_embedder(EmbedderConfig(device="cpu"))
    texts = (
        [fact for _, fact in facts] + [r for pairs in rewrites.values() for _, r in pairs] + [e for _, _, e in events]
    )
    vectors = embedder.embed(texts)
    fact_vectors = vectors[: len(facts)]
    offset = len(facts)
    rewrite_cosines = {}
    for name, pairs in rewrites.items():
        block = vectors[offset : offset + len(pairs)]
        rewrite_cosines[name] = np.array([float(v @ fact_vectors[i]) for (i, _), v in zip(pairs, block, strict=True)])
        offset += len(pairs)
    event_vectors = vectors[offset:]
    console.log(
        f"{len(facts)} facts in {len(sessions)} sessions, {len(events)} events; embedded in "
        f"{time.perf_counter() - started:.0f}s"
    )

    distinct, same_numbers, partner_max = [], [], np.zeros(len(facts))
    start = 0
    for facts_of_session in sessions:
        n = len(facts_of_session)
        block = fact_vectors[start : start + n]
        drafts = [EpisodeDraft(title=s, summary=f, details=f, timestamp="2023") for s, f in facts_of_session]
        keys = [content_key(d) for d in drafts]
        sims = block @ block.T
        for i in range(n):
            others = [sims[i, j] for j in range(n) if j != i and keys[j] != keys[i]]
            partner_max[start + i] = max(others, default=-1.0)
            distinct += [sims[i, j] for j in range(i + 1, n) if keys[j] != keys[i]]
            same_numbers += [numbers(drafts[i]) == numbers(drafts[j]) for j in range(i + 1, n) if keys[j] != keys[i]]
        start += n
    distinct, same_numbers = np.array(distinct), np.array(same_numbers)

    starts = np.cumsum([0] + [len(s) for s in sessions])
    event_best = []
    for position, (session_index, speaker, _) in enumerate(events):
        members = [starts[session_index] + j for j, (s, _) in enumerate(sessions[session_index]) if s == speaker]
        if members:
            event_best.append(float(np.max(fact_vectors[members] @ event_vectors[position])))
    event_best = np.array(event_best)

    table = Table(title="share at or above each cosine threshold (MiniLM, index texts)")
    table.add_column("threshold", justify="right")
    table.add_column(f"distinct pairs (n={len(distinct)})", justify="right")
    table.add_column("distinct pairs, same numbers (the guard)", justify="right")
    table.add_column(f"facts merged (n={len(facts)})", justify="right")
    for name, cos in rewrite_cosines.items():
        table.add_column(f"reworded: {name} (n={len(cos)})", justify="right")
    table.add_column(f"paraphrase: event (n={len(event_best)})", justify="right")
    default = CurationConfig().duplicate_cosine
    rows = []
    for t in sorted({*THRESHOLDS, default}):
        row = {
            "threshold": t,
            "distinct_pairs": float(np.mean(distinct >= t)),
            "distinct_pairs_n": int(np.sum(distinct >= t)),
            "guarded_pairs_n": int(np.sum((distinct >= t) & same_numbers)),
            "facts_merged": float(np.mean(partner_max >= t)),
            **{f"reworded_{n}": float(np.mean(c >= t)) for n, c in rewrite_cosines.items()},
            "paraphrase_event": float(np.mean(event_best >= t)),
        }
        rows.append(row)
        table.add_row(
            f"{t:.2f}",
            f"{row['distinct_pairs']:.4f} ({row['distinct_pairs_n']})",
            str(row["guarded_pairs_n"]),
            f"{row['facts_merged']:.4f}",
            *(f"{row[f'reworded_{n}']:.3f}" for n in rewrite_cosines),
            f"{row['paraphrase_event']:.3f}",
            style="bold" if t == default else None,
        )
    console.print(table)
    console.print(f"bold: the configured default (curation.duplicate_cosine = {default})")
    worst = np.argsort(-partner_max)[:8]
    console.print("closest distinct pairs of one session (what a lower threshold would merge):")
    for i in worst:
        s = int(np.searchsorted(starts, i, side="right") - 1)
        block = fact_vectors[starts[s] : starts[s + 1]]
        sims = block @ fact_vectors[i]
        order = [j for j in np.argsort(-sims) if starts[s] + j != i]
        j = order[0]
        console.print(f"  {partner_max[i]:.3f}  {facts[i][1]!r}\n         {sessions[s][j][1]!r}")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
