"""Small builders for sessions and memories used across tests."""

from __future__ import annotations

import importlib.util
import json
import re
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import ModuleType

from hybridmem_local.llm.base import LLMRequest, LLMResult
from hybridmem_local.llm.replies import check_reply
from hybridmem_local.schema import EpisodeDraft, Session, TupleDraft, Turn

BASE_DATE = datetime(2023, 5, 8, 13, 56, tzinfo=timezone.utc)
SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def load_script(name: str) -> ModuleType:
    """``scripts/<name>.py`` as a module (scripts are not a package), for tests of its functions."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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


_LINE = re.compile(r"^\[([^\]]+)\] ([^:]+): (.*)$", re.MULTILINE)


class EchoLLM:
    """A StructuredLLM whose memories repeat the turns: an episode of the window, a tuple per
    turn; ``marks`` (turn id → what) are written as forget requests."""

    model_id = "echo:test"

    def __init__(self, marks: dict[str, str] | None = None):
        self.marks = marks or {}

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def generate(self, requests: Sequence[LLMRequest]) -> list[LLMResult]:
        results = []
        for request in requests:
            lines = _LINE.findall(request.messages[-1].content)
            reply = {
                "episodes": [
                    {
                        "title": "Conversation",
                        "summary": lines[0][2][:190],
                        "details": " ".join(text for _, _, text in lines)[:590],
                        "timestamp": "2024-03-04",
                        "source_turn_ids": [turn_id for turn_id, _, _ in lines][:6],
                    }
                ],
                "tuples": [
                    {
                        "entity": speaker,
                        "relation": "said",
                        "object": text[:110],
                        "timestamp": "2024-03-04",
                        "context": "",
                        "source_turn_ids": [turn_id],
                    }
                    for turn_id, speaker, text in lines
                ],
                "forget_requests": [
                    {"what": what, "turn_id": turn_id}
                    for turn_id, what in self.marks.items()
                    if turn_id in {t for t, _, _ in lines}
                ],
            }
            text = json.dumps(reply)
            parsed, problem = check_reply(text, request.output_schema)
            results.append(LLMResult(text=text, parsed=parsed, error=problem))
        return results

    def close(self) -> None:
        pass
