"""Small builders for sessions and memories used across tests."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from hybridmem_local.schema import EpisodeDraft, Session, TupleDraft, Turn

BASE_DATE = datetime(2023, 5, 8, 13, 56, tzinfo=timezone.utc)


def make_session(namespace: str, index: int, n_turns: int = 4, speakers=("Alice", "Bob")) -> Session:
    sid = f"s{index}"
    return Session(
        session_id=sid,
        namespace=namespace,
        started_at=BASE_DATE + timedelta(days=7 * index),
        turns=[
            Turn(
                turn_id=f"{sid}:{i}",
                speaker=speakers[i % len(speakers)],
                text=f"Session {index} turn {i}: talking about topic {index * 31 + i}.",
            )
            for i in range(n_turns)
        ],
    )


def make_tuple(entity: str, relation: str, obj: str, turn_ids=(), day: int = 1) -> TupleDraft:
    return TupleDraft(
        entity=entity,
        relation=relation,
        object=obj,
        timestamp=f"2023-05-{day:02d}",
        context="",
        source_turn_ids=list(turn_ids),
    )


def make_episode(title: str, details: str, turn_ids=(), day: int = 1) -> EpisodeDraft:
    return EpisodeDraft(
        title=title, summary=title, details=details, timestamp=f"2023-05-{day:02d}", source_turn_ids=list(turn_ids)
    )
