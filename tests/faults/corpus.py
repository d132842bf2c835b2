"""Deterministic sessions with the memories curated from them, for crash and concurrency tests.

Every session cites its own turns, so "a session is wholly present or absent" can be checked
row by row: the session row, each of its turns, and each memory whose ``source_session_id``
names it.
"""

from __future__ import annotations

import json
import random
from datetime import timedelta
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from hybridmem_local.schema import EpisodeDraft, Session, TupleDraft, Turn
from tests.factories import BASE_DATE

PEOPLE = ["Ann", "Ben", "Cal", "Dee", "Eve", "Fay", "Gus", "Hal", "Ivy", "Jon", "Kim", "Lou"]
PLACES = ["Paris", "Lima", "Oslo", "Cairo", "Quito", "Hanoi", "Perth", "Dakar", "Bern", "Riga", "Leeds", "Turin"]
THINGS = [
    "bicycle",
    "violin",
    "garden",
    "kayak",
    "novel",
    "camera",
    "telescope",
    "puppy",
    "quilt",
    "drone",
    "sourdough starter",
    "chess set",
    "tent",
    "guitar",
]
VERBS = ["bought", "visited", "painted", "sold", "lent", "repaired", "photographed", "borrowed"]

#: Queries whose results are compared between a repaired index and a fresh rebuild.
QUERIES = [
    "Who bought a kayak in Oslo?",
    "Which city did Eve visit?",
    "painted a quilt",
    "Gus repaired a drone",
    "a trip to Hanoi with a camera",
]


class CuratedSession(BaseModel):
    """A session and the memories its curation produced."""

    model_config = ConfigDict(extra="forbid")

    session: Session
    episodes: list[EpisodeDraft]
    tuples: list[TupleDraft]

    @property
    def n_memories(self) -> int:
        return len(self.episodes) + len(self.tuples)


def curated_sessions(namespace: str, count: int, seed: int = 0, first: int = 1, turns: int = 5) -> list[CuratedSession]:
    """``count`` sessions ``s{first}..`` of ``namespace``, each with 2 episodes and 4 tuples."""
    rng = random.Random(seed * 7919 + first)
    out = []
    for index in range(first, first + count):
        sid = f"s{index}"
        day = BASE_DATE + timedelta(days=3 * index)
        lines = []
        for i in range(turns):
            who, verb, thing, place = rng.choice(PEOPLE), rng.choice(VERBS), rng.choice(THINGS), rng.choice(PLACES)
            lines.append((who, f"Last week I {verb} a {thing} in {place}, session {index} line {i}."))
        session = Session(
            session_id=sid,
            namespace=namespace,
            started_at=day,
            turns=[Turn(turn_id=f"{sid}:{i}", speaker=who, text=text) for i, (who, text) in enumerate(lines)],
        )
        stamp = f"{day:%Y-%m-%d}"
        episodes = [
            EpisodeDraft(
                title=f"{lines[i][0]}'s week",
                summary=lines[i][1],
                details=f"{lines[i][0]} said: {lines[i][1]}",
                timestamp=stamp,
                source_turn_ids=[f"{sid}:{i}"],
            )
            for i in (0, 1)
        ]
        tuples = []
        for i in range(4):
            who, text = lines[(i + 1) % turns]
            words = text.split()
            tuples.append(
                TupleDraft(
                    entity=who,
                    relation=words[3],
                    object=" ".join(words[4:8]).rstrip(","),
                    timestamp=stamp,
                    context=f"said in session {index}",
                    source_turn_ids=[f"{sid}:{(i + 1) % turns}"],
                )
            )
        out.append(CuratedSession(session=session, episodes=episodes, tuples=tuples))
    return out


def write_jsonl(items: list[BaseModel], path: Path) -> Path:
    path.write_text("".join(item.model_dump_json() + "\n" for item in items), encoding="utf-8")
    return path


def read_curated(path: Path) -> list[CuratedSession]:
    return [CuratedSession.model_validate(json.loads(line)) for line in path.read_text(encoding="utf-8").splitlines()]
