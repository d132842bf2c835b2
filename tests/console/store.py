"""A small store for the console tests, filled without an LLM: sessions stored raw, memories
added with their source session (which marks it curated), a forget request that leaves a
pending redaction, and a second namespace the alice keys must never see."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from hybridmem_local.memory import HybridMemory
from hybridmem_local.schema import EpisodeDraft, Session, TupleDraft, Turn

START = datetime(2023, 5, 7, 10, 0, tzinfo=timezone.utc)
SSN = "123-45-6789"
BOB_SECRET = "Bob keeps his spare key under the blue flowerpot"


def session(namespace: str, session_id: str, texts: list[str], day: int = 0) -> Session:
    return Session(
        namespace=namespace,
        session_id=session_id,
        started_at=START + timedelta(days=day),
        turns=[
            Turn(turn_id=f"{session_id}:{i}", speaker="Alice" if i % 2 == 0 else "Assistant", text=text)
            for i, text in enumerate(texts)
        ],
    )


def fill(memory: HybridMemory, bulk: int = 0) -> dict[str, int]:
    """Returns the ids of the memories a test looks for by name."""
    memory.enqueue(
        [
            session(
                "alice",
                "s1",
                [
                    "We adopted a beagle puppy last week, we named him Biscuit.",
                    "Congratulations! How is Biscuit settling in?",
                    "Great. We also moved to a flat on Oak Avenue in May.",
                ],
            ),
            session("bob", "b1", [BOB_SECRET + ".", "Noted."]),
        ]
    )
    [biscuit, oak] = memory.add_memories(
        "alice",
        episodes=[
            EpisodeDraft(
                title="Biscuit the beagle",
                summary="Alice adopted a beagle puppy named Biscuit",
                details="Alice and her partner adopted a beagle puppy and named him Biscuit.",
                timestamp="2023-05-01",
                source_turn_ids=["s1:0", "s1:1"],
            )
        ],
        tuples=[
            TupleDraft(
                entity="Alice",
                relation="moved to",
                object="a flat on Oak Avenue",
                timestamp="2023-05-01",
                source_turn_ids=["s1:2"],
            )
        ],
        source_session_id="s1",
    )
    [bob] = memory.add_memories(
        "bob",
        tuples=[
            TupleDraft(
                entity="Bob",
                relation="hides spare key under",
                object="the blue flowerpot",
                timestamp="2023-05-01",
                source_turn_ids=["b1:0"],
            )
        ],
        source_session_id="b1",
    )
    # A forget request: stored, it redacts the number at once and waits for an admin's review.
    memory.enqueue(
        [session("alice", "s2", [f"For the tax form: my social security number is {SSN}.", "Noted."], day=1)]
    )
    memory.enqueue([session("alice", "s3", ["Please forget my social security number.", "Sure."], day=2)])
    memory.enqueue([session("alice", "s4", ["My PIN is 4321. Actually, forget that.", "Okay."], day=3)])
    if bulk:
        memory.enqueue([session("bulk", "k1", [f"fact {i}" for i in range(bulk)])])
        memory.add_memories(
            "bulk",
            tuples=[
                TupleDraft(
                    entity=f"thing {i}",
                    relation="is",
                    object=f"number {i}",
                    timestamp="2023-05-01",
                    source_turn_ids=[f"k1:{i}"],
                )
                for i in range(bulk)
            ],
            source_session_id="k1",
        )
    return {"biscuit": biscuit, "oak": oak, "bob": bob}
