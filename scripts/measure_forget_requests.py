"""Forget requests in conversations, measured on hand-written sessions (issue #25 item 3).

    PYTHONPATH=$PWD python scripts/measure_forget_requests.py                  # rules only
    PYTHONPATH=$PWD python scripts/measure_forget_requests.py --llm --set llm.n_threads=1
    PYTHONPATH=$PWD python scripts/measure_forget_requests.py --scan ../shared/data/locomo/locomo_dev8.json

Each scenario of tests/fixtures/forget_requests.jsonl (explicit and indirect requests, requests
naming what an earlier session said, sessions that only mention forgetting) is ingested into a
namespace of its own, curated, and redacted as the library does. Then per scenario: the requests
found (and by whom), which of its ``must_remove`` strings are gone from every turn and active
memory (removed) or not (missed), which of its ``must_keep`` strings are gone from the turns
(false removals), and what changed.

Without ``--llm`` curation is a stand-in whose memories repeat each turn (so they hold what is
asked to be forgotten) and which marks no request: the rules alone (``curation.forget_requests:
rules``). With ``--llm`` the configured LLM curates (the default: Qwen2.5-Coder-1.5B on llama.cpp)
and marks requests too (``rules+llm``).

``--scan FILE`` runs only the rules over every turn of a sessions file (LoCoMo JSON, session
JSONL): a corpus without forget requests, where each request found is a false one.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path

from hybridmem_local.config import load_config
from hybridmem_local.curation.redaction import detect_requests
from hybridmem_local.files.session_files import read_sessions_file
from hybridmem_local.memory import HybridMemory
from hybridmem_local.schema import Session, Turn

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the curation stand-in the tests use: tests/factories.py
from tests.factories import EchoLLM  # noqa: E402

FIXTURE = REPO / "tests" / "fixtures" / "forget_requests.jsonl"
START = datetime(2024, 3, 4, 9, 0, tzinfo=timezone.utc)


def scenario_sessions(scenario: dict) -> list[Session]:
    return [
        Session(
            session_id=s["session_id"],
            namespace=scenario["name"],
            started_at=START + timedelta(days=day),
            turns=[
                Turn(turn_id=f"{s['session_id']}:{i}", speaker=speaker, text=text)
                for i, (speaker, text) in enumerate(s["turns"])
            ],
        )
        for day, s in enumerate(scenario["sessions"])
    ]


def measure(memory: HybridMemory, scenario: dict) -> dict:
    namespace = scenario["name"]
    turns = {
        r.session.session_id + "/" + t.turn_id: t.text
        for r in memory.store.sessions.select(namespace)
        for t in r.session.turns
    }
    memories = [m.index_text() for m in memory.list(namespace)]
    everything = "\n".join([*turns.values(), *memories])
    turn_text = "\n".join(turns.values())
    redactions = memory.redactions(namespace)
    unmatched = [
        request
        for (after,) in memory.store.conn.execute(
            "SELECT after FROM events WHERE namespace = ? AND action = 'forget_request'", (namespace,)
        )
        for request in json.loads(after)["requests"]
    ]
    requests = [r for red in redactions for r in red.requests] + unmatched
    return {
        "name": namespace,
        "kind": scenario["kind"],
        "requests": [
            f"{r['what']!r} ({r['detected_by']}{', nothing matched' if r in unmatched else ''})" for r in requests
        ],
        "removed": [s for s in scenario["must_remove"] if s not in everything],
        "missed": [s for s in scenario["must_remove"] if s in everything],
        "kept": [s for s in scenario["must_keep"] if s in turn_text],
        "false_removals": [s for s in scenario["must_keep"] if s not in turn_text],
        "turns_changed": {
            t: turns[k] for red in redactions for t in red.turn_ids for k in turns if k.endswith("/" + t)
        },
        "memories_rewritten": sum(len(red.rewritten) for red in redactions),
        "memories_deleted": sum(len(red.deleted) for red in redactions),
    }


def scan(path: Path) -> int:
    """The rules over every turn of ``path``: each request found in a corpus without any is a false one."""
    sessions = read_sessions_file(path, None)
    found = [(s, r) for s in sessions for r in detect_requests(s)]
    turns = sum(len(s.turns) for s in sessions)
    print(f"# {path.name}: {len(sessions)} sessions, {turns} turns, {len(found)} forget requests found by the rules")
    for session, request in found:
        text = next(t.text for t in session.turns if t.turn_id == request.turn_id)
        print(f"  {session.namespace} {request.turn_id} {request.what!r}: {text}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llm", action="store_true", help="curate with the configured LLM (rules+llm)")
    parser.add_argument("--config", type=Path, default=None)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    parser.add_argument("--fixture", type=Path, default=FIXTURE)
    parser.add_argument("--json", type=Path, default=None, help="also write the rows as JSON here")
    parser.add_argument("--only", action="append", default=[], metavar="NAME", help="only these scenarios")
    parser.add_argument("--scan", type=Path, default=None, help="only count the rules' requests in this sessions file")
    args = parser.parse_args(argv)
    if args.scan is not None:
        return scan(args.scan)

    overrides = dict(item.split("=", 1) for item in args.set)
    overrides.setdefault("consolidation.every_n_sessions", "0")
    overrides["curation.forget_requests"] = "rules+llm" if args.llm else "rules"
    config = load_config(args.config, overrides)
    scenarios = [json.loads(line) for line in args.fixture.read_text(encoding="utf-8").splitlines() if line.strip()]
    scenarios = [s for s in scenarios if not args.only or s["name"] in args.only]
    sessions = [s for scenario in scenarios for s in scenario_sessions(scenario)]
    # Sessions in their order within a scenario: a later session's request finds the earlier one stored.
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        llm = None if args.llm else EchoLLM()
        with HybridMemory.open(Path(folder) / "measure.db", config, llm=llm) as memory:
            report = memory.ingest(sessions)
            rows = [measure(memory, scenario) for scenario in scenarios]
    elapsed = time.perf_counter() - started

    mode = f"rules + LLM ({config.llm.model})" if args.llm else "rules only"
    print(f"# forget requests, {mode}: {len(scenarios)} scenarios, {len(sessions)} sessions, {elapsed:.0f} s")
    print(f"# curated {report.curated}, failed {report.failed}; LLM requests {report.usage.requests}\n")
    print("| scenario | kind | requests found | removed | missed | false removals | memories rewritten / deleted |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['name']} | {row['kind']} | {'; '.join(row['requests']) or '—'} | "
            f"{', '.join(row['removed']) or '—'} | {', '.join(row['missed']) or '—'} | "
            f"{', '.join(row['false_removals']) or '—'} | {row['memories_rewritten']} / {row['memories_deleted']} |"
        )
    must_remove = sum(len(r["removed"]) + len(r["missed"]) for r in rows)
    must_keep = sum(len(r["kept"]) + len(r["false_removals"]) for r in rows)
    mentions = [r for r in rows if r["kind"].startswith("mention")]
    print(
        f"\nremoved {sum(len(r['removed']) for r in rows)}/{must_remove}; "
        f"false removals {sum(len(r['false_removals']) for r in rows)}/{must_keep}; "
        f"mention-only scenarios with a request found: {sum(bool(r['requests']) for r in mentions)}/{len(mentions)}"
    )
    print("\nturns after redaction:")
    for row in rows:
        for turn_id, text in row["turns_changed"].items():
            print(f"  {row['name']} {turn_id}: {text}")
    if args.json is not None:
        args.json.write_text(json.dumps({"mode": mode, "seconds": elapsed, "rows": rows}, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
