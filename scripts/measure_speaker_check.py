"""The two speaker checks of ``text/attribution.py`` on the 100 hand-labelled memories of §15.

    PYTHONPATH=$PWD .venv/bin/python scripts/measure_speaker_check.py
    PYTHONPATH=$PWD .venv/bin/python scripts/measure_speaker_check.py --data PATH --out PATH

``docs/results/locomo-study/memory_precision.jsonl`` holds 100 memories curated from LoCoMo
conv-30, each labelled by hand (right, wrong_speaker, wrong_date, not_in_turns, invented_detail;
docs/benchmarks.md §15). For each memory this runs

* the old check, ``unsupported_subjects``: its subject must be spoken of by a turn it cites;
* the new check, ``misattributed``: the turns of its session that state its content must not be
  the other person's own news;

and prints, per label, how many memories each check flags, then the wrong-speaker memories
caught, the right ones flagged (false flags) and the precision of the memories a check keeps
(right / kept), each with a Wilson 95% interval. ``--out`` gets the same figures and, per memory,
what each check found, so a reader can audit every flag.

The file keeps each memory as rendered text, not its fields: the memory is parsed back here
("Entity — relation — object (date; context)" for tuples, "(date) Title: details" for episodes;
an episode's summary is not rendered, so it is aligned by title and details). Its session is
the one its cited turns belong to; the turns come from the LoCoMo file.

The new check's rule was chosen on these same 100 memories, so its figures are optimistic. A
second measure needs no labels and no LLM: LoCoMo's ``observation`` field holds facts about each
speaker of each session with their evidence turn (right by construction, give or take the
dataset's own errors). Each is checked as a memory about its person (an episode titled with the
name: ``right``) and about the other one (``swapped``, the wrong-speaker error made on purpose),
over the 7 conversations the rule was not chosen on and over all 8; the old check is given the
evidence turn as its cited turn.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from hybridmem_local.eval.locomo import load_locomo
from hybridmem_local.eval.metrics import wilson_interval
from hybridmem_local.eval.precision import LABELS
from hybridmem_local.schema import EpisodeDraft, Session, TupleDraft, Turn
from hybridmem_local.text.attribution import SessionAttribution, unsupported_subjects

REPO = Path(__file__).resolve().parents[1]
STUDY = REPO / "docs/results/locomo-study"
CHECKS = ("old", "new", "either")
_TUPLE = re.compile(
    r"^(?P<entity>.*?) — (?P<relation>.*?) — (?P<object>.*) \((?P<ts>[^;()]+?)(?:; (?P<context>.*))?\)$", re.S
)
_EPISODE = re.compile(r"^\((?P<ts>[^)]+)\) (?P<title>.*?): (?P<details>.*)$", re.S)


def parse_memory(kind: str, text: str, timestamp: str) -> EpisodeDraft | TupleDraft:
    """The memory's fields back from the text ``render()`` made of it."""
    if kind == "tuple":
        match = _TUPLE.match(text)
        if match is None:
            raise ValueError(f"not a rendered tuple: {text!r}")
        return TupleDraft(
            entity=match["entity"],
            relation=match["relation"],
            object=match["object"],
            timestamp=timestamp,
            context=match["context"] or "",
        )
    match = _EPISODE.match(text)
    if match is None:
        raise ValueError(f"not a rendered episode: {text!r}")
    return EpisodeDraft(title=match["title"], summary=match["details"], details=match["details"], timestamp=timestamp)


def wilson(successes: int, n: int) -> list[float] | None:
    """Wilson score 95% interval of ``successes / n``, rounded for the record (None when ``n`` is 0)."""
    interval = wilson_interval(successes, n)
    return None if interval is None else [round(end, 4) for end in interval]


def share(successes: int, n: int) -> dict:
    return {
        "count": successes,
        "of": n,
        "share": round(successes / n, 4) if n else None,
        "ci95_wilson": wilson(successes, n),
    }


def session_of(turn_ids: Sequence[str], sessions: Sequence[Session]) -> Session | None:
    """The session holding the first of ``turn_ids`` that exists."""
    by_turn = {t.turn_id: s for s in sessions for t in s.turns}
    return next((by_turn[t] for t in turn_ids if t in by_turn), None)


def measure(rows: Sequence[dict], conversations: dict) -> dict:
    audit = []
    for row in rows:
        conversation = conversations[row["conversation_id"]]
        people = sorted({conversation.speaker_a, conversation.speaker_b})
        memory = parse_memory(row["kind"], row["memory"], row["timestamp"])
        turns = {t.turn_id: t for s in conversation.sessions for t in s.turns}
        cited_ids = [t["turn_id"] for t in row["source_turns"]]
        cited: list[Turn] = [turns[t] for t in cited_ids if t in turns]
        session = session_of(cited_ids, conversation.sessions)
        check = SessionAttribution(session.turns if session else [], people)
        old = sorted(unsupported_subjects(memory, cited, people))
        new = sorted(check.misattributed(memory))
        audit.append(
            {
                "memory_id": row["memory_id"],
                "label": row["label"],
                "memory": row["memory"],
                "session": session.session_id if session else None,
                "stating_turns": [t.turn_id for t in check.stating_turns(memory)],
                "old_flags": old,
                "new_flags": new,
                "old_flag_as_recorded": row["unsupported_subjects"],
            }
        )
    flagged = {
        "old": [bool(a["old_flags"]) for a in audit],
        "new": [bool(a["new_flags"]) for a in audit],
    }
    flagged["either"] = [o or n for o, n in zip(flagged["old"], flagged["new"], strict=True)]
    labels = [a["label"] for a in audit]
    right_total = labels.count("right")
    summary: dict = {
        "memories": len(audit),
        "labels": {label: labels.count(label) for label in LABELS},
        "precision_all": share(right_total, len(audit)),
        "checks": {},
    }
    for check in CHECKS:
        flags = flagged[check]
        kept = [label for label, f in zip(labels, flags, strict=True) if not f]
        summary["checks"][check] = {
            "flags_per_label": {
                label: sum(f for lb, f in zip(labels, flags, strict=True) if lb == label) for label in LABELS
            },
            "flagged": sum(flags),
            "caught_wrong_speaker": share(
                sum(f for lb, f in zip(labels, flags, strict=True) if lb == "wrong_speaker"),
                labels.count("wrong_speaker"),
            ),
            "false_flags_right": share(
                sum(f for lb, f in zip(labels, flags, strict=True) if lb == "right"), right_total
            ),
            "precision_kept": share(kept.count("right"), len(kept)),
        }
    recorded_differs = [a["memory_id"] for a in audit if a["old_flags"] != a["old_flag_as_recorded"]]
    return {"summary": summary, "old_check_differs_from_recorded": recorded_differs, "per_memory": audit}


def observation_memories(raw: dict, conversation) -> list[tuple[str, str, str, Session, Turn]]:
    """(person, other person, fact, session, evidence turn) for each observation of a LoCoMo sample
    whose person is a speaker and whose first evidence id is a turn."""
    people = sorted({conversation.speaker_a, conversation.speaker_b})
    sessions = {t.turn_id: s for s in conversation.sessions for t in s.turns}
    turns = {t.turn_id: t for s in conversation.sessions for t in s.turns}
    facts = []
    for per_person in (raw.get("observation") or {}).values():
        for person, observations in per_person.items():
            if person not in people or len(people) != 2:
                continue
            other = next(p for p in people if p != person)
            for fact, evidence in observations:
                first = (evidence if isinstance(evidence, str) else (evidence or [""])[0]).split(";")[0].strip()
                if first in turns:
                    facts.append((person, other, fact, sessions[first], turns[first]))
    return facts


def measure_observations(raw_samples: dict, conversations: dict, tuned_on: set[str]) -> dict:
    """Both checks on LoCoMo's gold observations, as themselves (right) and given to the other
    speaker (swapped); see the module docstring."""
    per_conversation: dict[str, Counter[str]] = {}
    false_flags = []
    for conversation_id, conversation in conversations.items():
        people = sorted({conversation.speaker_a, conversation.speaker_b})
        # Each session's turns stemmed once for all the facts checked against it.
        checks = {s.session_id: SessionAttribution(s.turns, people) for s in conversation.sessions}
        counts: Counter[str] = Counter()
        for person, other, fact, session, evidence in observation_memories(raw_samples[conversation_id], conversation):
            right = EpisodeDraft(title=person, summary=fact, details=fact, timestamp="2023-01-01")
            as_given = {"right": right, "swapped": right.model_copy(update={"title": other})}
            check = checks[session.session_id]
            new_flags = {kind: check.misattributed(memory) for kind, memory in as_given.items()}
            counts["facts"] += 1
            for kind, memory in as_given.items():
                counts[f"old_{kind}"] += bool(unsupported_subjects(memory, [evidence], people))
                counts[f"new_{kind}"] += bool(new_flags[kind])
            if new_flags["right"]:
                false_flags.append(
                    {
                        "conversation_id": conversation_id,
                        "person": person,
                        "observation": fact,
                        "evidence": evidence.turn_id,
                        "stating_turns": [t.turn_id for t in check.stating_turns(right)],
                    }
                )
        per_conversation[conversation_id] = counts
    summary = {}
    for group in ("held_out", "all"):
        members = [c for c in conversations if group == "all" or c not in tuned_on]
        total = sum((per_conversation[c] for c in members), Counter())
        summary[group] = {
            "conversations": members,
            "facts": total["facts"],
            **{
                check: {
                    "right_flagged": share(total[f"{check}_right"], total["facts"]),
                    "swapped_caught": share(total[f"{check}_swapped"], total["facts"]),
                }
                for check in ("old", "new")
            },
        }
    return {
        "summary": summary,
        "per_conversation": {c: dict(counts) for c, counts in per_conversation.items()},
        "new_check_flags_right": false_flags,
    }


def pct(s: dict) -> str:
    if s["share"] is None:  # nothing to count (e.g. no memory kept when every one is flagged)
        return f"{s['count']}/{s['of']}"
    low, high = s["ci95_wilson"]
    return f"{s['count']}/{s['of']} = {100 * s['share']:.1f}% ({100 * low:.1f}–{100 * high:.1f})"


def observation_table(summary: dict) -> str:
    lines = ["| facts of | check | right facts flagged | swapped facts caught |", "|---|---|---|---|"]
    for group, s in summary.items():
        name = f"{len(s['conversations'])} conversations" + (" not tuned on" if group == "held_out" else "")
        for check in ("old", "new"):
            lines.append(f"| {name} | {check} | {pct(s[check]['right_flagged'])} | {pct(s[check]['swapped_caught'])} |")
    return "\n".join(lines)


def table(summary: dict) -> str:
    head = f"| label | memories | {' | '.join(f'{c} check flags' for c in CHECKS)} |"
    lines = [head, "|" + "---|" * (2 + len(CHECKS))]
    for label in LABELS:
        flags = " | ".join(str(summary["checks"][c]["flags_per_label"][label]) for c in CHECKS)
        lines.append(f"| {label} | {summary['labels'][label]} | {flags} |")
    lines.append(f"\nall memories: precision {pct(summary['precision_all'])}")
    lines.append("\n| check | caught wrong_speaker | right flagged | precision of kept |")
    lines.append("|---|---|---|---|")
    for c in CHECKS:
        s = summary["checks"][c]
        lines.append(
            f"| {c} | {pct(s['caught_wrong_speaker'])} | {pct(s['false_flags_right'])} | {pct(s['precision_kept'])} |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared/data/locomo/locomo_dev8.json")
    parser.add_argument("--labels", type=Path, default=STUDY / "memory_precision.jsonl")
    parser.add_argument("--out", type=Path, default=STUDY / "speaker_check.json")
    args = parser.parse_args(argv)
    if not args.data.exists():
        print(f"skipped: the LoCoMo file {args.data} is absent (pass --data PATH to a copy of it)")
        return 0
    rows = [json.loads(line) for line in args.labels.read_text(encoding="utf-8").splitlines() if line.strip()]
    conversations = {c.sample_id: c for c in load_locomo(args.data).conversations}
    result = measure(rows, conversations)
    print(table(result["summary"]))
    if result["old_check_differs_from_recorded"]:
        print("old check differs from the recorded one for memories", result["old_check_differs_from_recorded"])
    raw_samples = {s["sample_id"]: s for s in json.loads(args.data.read_text(encoding="utf-8"))}
    observations = measure_observations(raw_samples, conversations, {r["conversation_id"] for r in rows})
    print("\nLoCoMo's gold observations, as themselves (right) and given to the other speaker (swapped):")
    print(observation_table(observations["summary"]))
    out = {
        "what": "the old (unsupported_subjects: cited turns) and new (misattributed: stating turns of the session) "
        "speaker checks of hybridmem_local/text/attribution.py on the hand-labelled memories of "
        "docs/benchmarks.md §15",
        "caveat": "the new check's rule was chosen on these same 100 memories: its figures are optimistic",
        "command": "PYTHONPATH=$PWD .venv/bin/python scripts/measure_speaker_check.py",
        "labels_file": str(args.labels.relative_to(REPO)) if args.labels.is_relative_to(REPO) else str(args.labels),
        "either": "a memory flagged by the old or the new check",
        "intervals": "Wilson score, 95%",
        **result,
        "observations": {
            "what": "LoCoMo's gold observations checked as memories about their person (right) and about the "
            "other speaker (swapped); held_out: the conversations other than the labelled sample's; the Wilson "
            "intervals treat facts as independent, which they are not within a conversation (see per_conversation)",
            **observations,
        },
    }
    args.out.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
