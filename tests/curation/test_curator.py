"""Session curation: windows, one batched call, retries, checking of replies; then SmolLM2 for real.

The fast tests use ``ScriptedLLM``: it stands in only for the model's free choice of content
(which memories, which cited ids) so that the curator's own post-processing can be checked
exactly. It validates replies with the real backends' ``check_reply`` and counts tokens as
words. Everything about model plumbing runs on the real SmolLM2 GGUF (``slow``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta, timezone
from itertools import pairwise
from pathlib import Path

import pytest

import hybridmem_local
from hybridmem_local.config import CurationConfig, LLMConfig
from hybridmem_local.curation.curator import Curator
from hybridmem_local.curation.replies import CurationReply, normalise_timestamp, reply_schema
from hybridmem_local.errors import LLMError
from hybridmem_local.llm.base import LLMRequest, LLMResult
from hybridmem_local.llm.replies import check_reply
from hybridmem_local.memory import HybridMemory
from hybridmem_local.prompts import load_prompt
from hybridmem_local.schema import CurationResult, Session, Turn
from tests.conftest import SMOLLM2_CONFIG

SESSION_DATE = datetime(2023, 5, 8, 13, 56, tzinfo=timezone.utc)
_TURN_LINE = re.compile(r"^\[([^\]]+)\] ", re.MULTILINE)


def shown_turn_ids(request: LLMRequest) -> list[str]:
    return _TURN_LINE.findall(request.messages[-1].content)


def reply_citing(
    ids_for: Callable[[list[str]], list[str]], timestamp: str = "2023-05-07"
) -> Callable[[LLMRequest], str]:
    """A reply with one episode and one tuple per request, citing ``ids_for(shown ids)``."""

    def reply(request: LLMRequest) -> str:
        shown = shown_turn_ids(request)
        cited = ids_for(shown)
        return json.dumps(
            {
                "episodes": [
                    {
                        "title": f"Talk {shown[0]}",
                        "summary": "s",
                        "details": "d",
                        "timestamp": timestamp,
                        "source_turn_ids": cited,
                    }
                ],
                "tuples": [
                    {
                        "entity": "Alice",
                        "relation": "said",
                        "object": f"words of {shown[0]}",
                        "timestamp": timestamp,
                        "context": "c",
                        "source_turn_ids": cited,
                    }
                ],
            }
        )

    return reply


class ScriptedLLM:
    """A StructuredLLM whose reply text comes from a function of the request."""

    model_id = "scripted:test"

    def __init__(self, reply: Callable[[LLMRequest], str | LLMResult]):
        self.reply = reply
        self.batches: list[list[LLMRequest]] = []

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def generate(self, requests: Sequence[LLMRequest]) -> list[LLMResult]:
        self.batches.append(list(requests))
        results = []
        for request in requests:
            reply = self.reply(request)
            if isinstance(reply, LLMResult):
                results.append(reply)
                continue
            parsed, problem = check_reply(reply, request.output_schema)
            prompt_tokens = sum(self.count_tokens(m.content) for m in request.messages)
            results.append(
                LLMResult(
                    text=reply,
                    parsed=parsed,
                    error=problem,
                    prompt_tokens=prompt_tokens,
                    completion_tokens=self.count_tokens(reply),
                    latency_s=0.5,
                )
            )
        return results


def make_session(
    session_id: str, texts: Sequence[str], namespace: str = "alice", started_at: datetime = SESSION_DATE
) -> Session:
    return Session(
        session_id=session_id,
        namespace=namespace,
        started_at=started_at,
        turns=[Turn(turn_id=f"{session_id}:{i}", speaker=("Alice", "Bob")[i % 2], text=t) for i, t in enumerate(texts)],
    )


def word_turns(n: int, words: int) -> list[str]:
    return [" ".join(f"w{i}x{j}" for j in range(words)) for i in range(n)]


LLM_CONFIG = LLMConfig(context_tokens=1024, max_new_tokens=300)


def curator_for(llm, retry_rounds: int = 1, annotate: bool = True, llm_config: LLMConfig = LLM_CONFIG) -> Curator:
    # Scripted replies are not written from their sessions' words, nor about their speakers: the
    # grounding and speaker checks are off here and tested on their own
    # (test_memories_not_from_the_window_are_left_out, test_the_other_speakers_news_is_left_out).
    config = CurationConfig(
        retry_rounds=retry_rounds, annotate_relative_dates=annotate, max_ungrounded_share=1.0, speaker_check=False
    )
    return Curator(llm, llm_config, config)


# --------------------------------------------------------------------------- prompt


def test_request_shows_session_date_turn_lines_and_annotated_dates():
    llm = ScriptedLLM(reply_citing(lambda shown: shown))
    curator = curator_for(llm)
    session = make_session("s1", ["I ran the 10K in Portland yesterday.", "Congrats! See you next week."])
    [window] = curator.windows(session)
    request = curator.request(window)
    user = request.messages[-1].content
    assert "Session date: 2023-05-08 (Monday) 13:56 UTC" in user
    assert "[s1:0] Alice: I ran the 10K in Portland yesterday [2023-05-07]." in user
    assert "[s1:1] Bob: Congrats! See you next week [week of 2023-05-15]." in user
    assert "Part of a longer session" not in user
    assert issubclass(request.output_schema, CurationReply)
    assert request.prompt_version == load_prompt("curation_small").version == "curation-small/v2"
    assert request.tag == "alice"
    assert request.salvage_partial  # a cut-off reply keeps its complete memories
    assert request.messages[0].role == "system" and "source_turn_ids" in request.messages[0].content
    # the worked example's ids name no real turn, so a copied one is dropped, never a wrong citation
    assert "[x:0]" in request.messages[0].content and "s1:" not in request.messages[0].content


def test_the_paper_prompt_shows_an_id_of_the_window_as_its_example():
    curator = Curator(ScriptedLLM(reply_citing(lambda shown: shown)), LLM_CONFIG, CurationConfig(prompt="curation"))
    [window] = curator.windows(make_session("s7", ["one", "two", "three"]))
    request = curator.request(window)
    assert request.prompt_version == "curation/v3"
    text = "\n".join(m.content for m in request.messages)
    assert '(e.g. "s7:1")' in text and text.count("s7:1") == 2 and "D1:3" not in text  # the example and its turn line


@pytest.mark.parametrize(
    ("turns", "episodes", "tuples", "tokens"),
    [(1, 1, 1, 32 + 200 + 110), (3, 1, 3, 32 + 200 + 330), (7, 3, 6, 32 + 600 + 660), (40, 3, 6, 32 + 600 + 660)],
)
def test_a_reply_is_sized_to_its_window(turns, episodes, tuples, tokens):
    roomy = LLMConfig(context_tokens=4096, max_new_tokens=2048)
    curator = curator_for(ScriptedLLM(reply_citing(lambda shown: shown)), llm_config=roomy)
    [window] = curator.windows(make_session("s1", [f"turn {i}" for i in range(turns)]))
    assert curator.reply_size(window) == (episodes, tuples, tokens)
    request = curator.request(window)
    assert request.max_new_tokens == tokens
    schema = request.output_schema.model_json_schema()["properties"]
    assert (schema["episodes"]["maxItems"], schema["tuples"]["maxItems"]) == (episodes, tuples)
    tight = curator_for(curator.llm)  # max_new_tokens 300
    assert tight.reply_size(tight.windows(make_session("s1", ["a", "b", "c"]))[0])[2] == 300  # never past the ceiling


def test_memories_not_from_the_window_are_left_out():
    """Qwen2.5-Coder-0.5B copied the worked example of curation_small into a session about a race."""

    def reply(request):
        cited = {"timestamp": "2023-05-08", "source_turn_ids": ["s1:0"]}
        fact = {**cited, "context": ""}
        return json.dumps(
            {
                "episodes": [
                    {
                        **cited,
                        "title": "The race",
                        "summary": "Bob ran.",
                        "details": "Bob ran the Riverside 10K in 52 minutes.",
                    },
                    {
                        **cited,
                        "title": "Lisbon",
                        "summary": "Bob is back.",
                        "details": "Bob is back from Lisbon, his third trip there; it took 9 hours.",
                    },
                ],
                "tuples": [
                    {**fact, "entity": "Bob", "relation": "finished in", "object": "52 minutes"},
                    {**fact, "entity": "Bob", "relation": "travelled to", "object": "Lisbon (third trip, 9 hours)"},
                ],
            }
        )

    session = make_session(
        "s1", ["I ran the Riverside 10K yesterday and finished in 52 minutes!", "Wow, congrats Bob!"]
    )
    config = CurationConfig(max_ungrounded_share=0.5, speaker_check=False)
    [outcome] = Curator(ScriptedLLM(reply), LLM_CONFIG, config).curate([session])
    assert outcome.ok, outcome.error
    assert [e.title for e in outcome.result.episodes] == ["The race"]
    assert [t.object for t in outcome.result.tuples] == ["52 minutes"]
    assert len(outcome.dropped_memories) == 2 and all("not in the conversation" in d for d in outcome.dropped_memories)
    off = Curator(ScriptedLLM(reply), LLM_CONFIG, config.model_copy(update={"max_ungrounded_share": 1.0}))
    assert len(off.curate([session])[0].result.tuples) == 2


def test_the_other_speakers_news_is_left_out():
    """The 1.5B's commonest error (docs/benchmarks.md §15): Bob's reply cited, Alice's news made his."""

    def reply(request):
        cited = {"timestamp": "2023-05-08", "context": ""}
        return json.dumps(
            {
                "episodes": [],
                "tuples": [
                    {
                        **cited,
                        "entity": "Bob",
                        "relation": "got",
                        "object": "a fashion internship",
                        "source_turn_ids": ["s1:1"],
                    },
                    {
                        **cited,
                        "entity": "Alice",
                        "relation": "got",
                        "object": "a fashion internship",
                        "source_turn_ids": ["s1:0"],
                    },
                    {
                        **cited,
                        "entity": "Bob",
                        "relation": "plans",
                        "object": "a trip to Lisbon",
                        "source_turn_ids": ["s1:1"],
                    },
                ],
            }
        )

    session = make_session(
        "s1", ["I got the fashion internship I applied for!", "Congrats on the internship! I plan a trip to Lisbon."]
    )
    config = CurationConfig(max_ungrounded_share=1.0)
    [outcome] = Curator(ScriptedLLM(reply), LLM_CONFIG, config).curate([session])
    assert [(t.entity, t.object) for t in outcome.result.tuples] == [
        ("Alice", "a fashion internship"),
        ("Bob", "a trip to Lisbon"),
    ]
    assert outcome.dropped_memories == ["tuple 'Bob': the other speaker's news, not Bob's"]
    off = Curator(ScriptedLLM(reply), LLM_CONFIG, config.model_copy(update={"speaker_check": False}))
    assert len(off.curate([session])[0].result.tuples) == 3


def test_annotation_can_be_switched_off():
    curator = curator_for(ScriptedLLM(reply_citing(lambda shown: shown)), annotate=False)
    [window] = curator.windows(make_session("s1", ["I went yesterday."]))
    assert "[s1:0] Alice: I went yesterday.\n" in curator.request(window).messages[-1].content + "\n"


def test_reply_schema_caps_lists_and_holds_timestamps_to_iso_dates():
    llm = ScriptedLLM(reply_citing(lambda shown: shown))
    curator = Curator(llm, LLM_CONFIG, CurationConfig(max_episodes_per_window=2, max_tuples_per_window=5))
    schema = reply_schema(2, 5).model_json_schema()
    assert schema["properties"]["episodes"]["maxItems"] == 2
    assert schema["properties"]["tuples"]["maxItems"] == 5
    pattern = re.compile(schema["$defs"]["EpisodeReply"]["properties"]["timestamp"]["pattern"])
    assert pattern.match("2023-05-07") and pattern.match("2023-05") and pattern.match("2023")
    assert not pattern.match("last week")
    # The caps shape decoding only: a longer reply (from a server that ignores schemas) is used.
    reply = json.loads(
        reply_citing(lambda shown: shown)(curator.request(curator.windows(make_session("s1", ["a"]))[0]))
    )
    reply["episodes"] *= 4
    assert len(reply_schema(2, 5).model_validate(reply).episodes) == 4


# --------------------------------------------------------------------------- windows


def test_windows_hold_whole_turns_within_the_budget_and_cover_each_turn_once():
    llm = ScriptedLLM(reply_citing(lambda shown: shown))
    curator = curator_for(llm)
    lengths = [5, 40, 12, 90, 3, 60, 60, 25, 7, 110, 15, 45]
    session = make_session("s1", [" ".join(["word"] * n) for n in lengths])
    windows = curator.windows(session)
    assert len(windows) > 1
    assert [t for w in windows for t in w.turn_ids] == [t.turn_id for t in session.turns]
    for window in windows:
        assert sum(llm.count_tokens(line + "\n") for line in window.lines) <= curator.turn_budget
    # Greedy: the next window's first turn would not have fitted in the previous window.
    for previous, following in pairwise(windows):
        used = sum(llm.count_tokens(line + "\n") for line in previous.lines)
        assert used + llm.count_tokens(following.lines[0] + "\n") > curator.turn_budget
    # Windows after the first say they are part of a longer session.
    assert (
        "Part of a longer session of 12 turns, starting at turn s1:" in curator.request(windows[1]).messages[-1].content
    )


def test_a_turn_longer_than_a_window_is_cut_to_fit():
    curator = curator_for(ScriptedLLM(reply_citing(lambda shown: shown)))
    long_text = " ".join(f"w{i}" for i in range(3000))
    session = make_session("s1", ["hello", long_text, "bye"])
    windows = curator.windows(session)
    assert [t for w in windows for t in w.turn_ids] == ["s1:0", "s1:1", "s1:2"]
    [cut] = [line for w in windows for line in w.lines if line.startswith("[s1:1]")]
    assert cut.endswith(" [cut]")
    assert curator.llm.count_tokens(cut) <= curator.turn_budget
    assert session.turns[1].text == long_text  # the stored turn is untouched


def test_all_windows_of_all_sessions_go_in_one_generate_call():
    llm = ScriptedLLM(reply_citing(lambda shown: shown))
    curator = curator_for(llm)
    sessions = [
        make_session("a", word_turns(20, 40)),
        make_session("b", word_turns(3, 5)),
        make_session("c", word_turns(15, 50)),
    ]
    expected_windows = sum(len(curator.windows(s)) for s in sessions)
    outcomes = curator.curate(sessions)
    assert len(llm.batches) == 1
    assert len(llm.batches[0]) == expected_windows > 3
    assert [o.session_id for o in outcomes] == ["a", "b", "c"]
    for session, outcome in zip(sessions, outcomes, strict=True):
        assert outcome.ok and isinstance(outcome.result, CurationResult)
        assert outcome.usage.requests == outcome.windows == len(curator.windows(session))
        # One episode per window, concatenated in turn order.
        assert [e.title for e in outcome.result.episodes] == [f"Talk {w.turn_ids[0]}" for w in curator.windows(session)]
        assert outcome.usage.prompt_tokens > 0 and outcome.usage.completion_tokens > 0
        assert outcome.usage.llm_s == pytest.approx(0.5 * outcome.usage.requests)


# --------------------------------------------------------------------------- checking replies


def test_cited_ids_must_name_turns_the_model_was_shown():
    def ids_for(shown: list[str]) -> list[str]:
        return [shown[0], f"[{shown[-1]}]", shown[0], "D1:3", "s1:999"]

    llm = ScriptedLLM(reply_citing(ids_for))
    outcome = curator_for(llm).curate([make_session("s1", ["one", "two", "three"])])[0]
    assert outcome.ok
    for memory in [*outcome.result.episodes, *outcome.result.tuples]:
        assert memory.source_turn_ids == ["s1:0", "s1:2"]  # bracket stripped, repeat removed
    assert outcome.dropped_turn_ids == ["D1:3", "s1:999"]


def test_without_an_embedder_a_memory_without_any_valid_id_is_kept_without_provenance():
    llm = ScriptedLLM(reply_citing(lambda shown: ["nonsense"]))
    outcome = curator_for(llm).curate([make_session("s1", ["one", "two"])])[0]
    assert outcome.ok and len(outcome.result.episodes) == 1
    assert outcome.result.episodes[0].source_turn_ids == []
    assert outcome.result.episodes[0].provenance is None
    assert outcome.dropped_turn_ids == ["nonsense"] and outcome.aligned_memories == 0


def test_a_memory_without_any_valid_id_is_aligned_to_the_turns_of_its_window(minilm):
    texts = [
        "I adopted a beagle puppy named Biscuit last Friday.",
        "I ran the Riverside 10K in 52 minutes.",
        "My coach Maria says I can get under 50 by autumn.",
    ]

    def reply(request: LLMRequest) -> str:
        return json.dumps(
            {
                "episodes": [
                    {
                        "title": "Race",
                        "summary": "Bob's 10K",
                        "details": "Bob finished the Riverside 10K in 52 minutes.",
                        "timestamp": "2023-05-07",
                        "source_turn_ids": ["13:56", "2023-05-07"],
                    },
                    {
                        "title": "Puppy",
                        "summary": "Alice's puppy",
                        "details": "Alice adopted Biscuit.",
                        "timestamp": "2023-05-05",
                        "source_turn_ids": ["s1:0"],
                    },
                ],
                "tuples": [
                    {
                        "entity": "Bob",
                        "relation": "coach",
                        "object": "Maria",
                        "timestamp": "2023-05-08",
                        "context": "says he can run under 50",
                        "source_turn_ids": [],
                    }
                ],
            }
        )

    # make_session gives the turns to Alice and Bob by turns, so Bob's coach is Alice's line here:
    # the speaker check is off, this is about alignment alone.
    config = CurationConfig(speaker_check=False)
    curator = Curator(ScriptedLLM(reply), LLM_CONFIG, config, embed=minilm.embed)
    outcome = curator.curate([make_session("s1", texts)])[0]
    race, puppy = outcome.result.episodes
    (coach,) = outcome.result.tuples
    assert (race.source_turn_ids[0], race.provenance) == ("s1:1", "aligned")
    assert (puppy.source_turn_ids, puppy.provenance) == (["s1:0"], "cited")
    assert (coach.source_turn_ids[0], coach.provenance) == ("s1:2", "aligned")
    assert outcome.aligned_memories == 2 and outcome.dropped_turn_ids == ["13:56", "2023-05-07"]


def test_alignment_only_reaches_the_turns_of_the_window_the_model_was_shown(minilm):
    config = CurationConfig(align_max_turns=3, align_min_score=0.0)
    curator = Curator(ScriptedLLM(reply_citing(lambda shown: ["13:56"])), LLM_CONFIG, config, embed=minilm.embed)
    session = make_session("s1", word_turns(20, 40))
    windows = curator.windows(session)
    assert len(windows) >= 2
    outcome = curator.curate([session])[0]
    for window, episode in zip(windows, outcome.result.episodes, strict=False):
        assert episode.provenance == "aligned"
        assert 1 <= len(episode.source_turn_ids) <= 3 and set(episode.source_turn_ids) <= set(window.turn_ids)


def test_ids_of_turns_in_another_window_are_dropped():
    llm = ScriptedLLM(reply_citing(lambda shown: [shown[0], "s1:0"]))
    curator = curator_for(llm)
    session = make_session("s1", word_turns(20, 40))
    windows = curator.windows(session)
    assert len(windows) >= 2
    outcome = curator.curate([session])[0]
    assert outcome.dropped_turn_ids == ["s1:0"]  # cited by every window but the first
    assert outcome.result.episodes[0].source_turn_ids == ["s1:0"]
    assert outcome.result.episodes[1].source_turn_ids == [windows[1].turn_ids[0]]


def test_memories_without_content_are_left_out_and_the_rest_of_the_reply_is_kept():
    # What SmolLM2-135M wrote for LoCoMo sessions: turn ids or the schema's name in place of
    # content, loops.
    loop = "You're doing a great job of taking care of yourself and your family. " * 4

    def reply(request: LLMRequest) -> str:
        first = shown_turn_ids(request)[0]
        episode = {"timestamp": "2023-05-07", "source_turn_ids": [first]}
        fact = {"timestamp": "2023-05-07", "context": "", "source_turn_ids": [first]}
        return json.dumps(
            {
                "episodes": [
                    {**episode, "title": first, "summary": first, "details": first},
                    {**episode, "title": "Support", "summary": "Kind words", "details": loop},
                    {**episode, "title": "EpisodeReply", "summary": "EpisodeReply", "details": "EpisodeReply"},
                    {
                        **episode,
                        "title": "Adoption",
                        "summary": "Caroline plans to adopt",
                        "details": "Caroline told Melanie at 13:56 that she researches adoption agencies.",
                    },
                ],
                "tuples": [
                    {**fact, "entity": first, "relation": first, "object": first},
                    {**fact, "entity": "D3:1:1:1:1:1:1", "relation": "is", "object": "x"},
                    {**fact, "entity": "love", "relation": "Love", "object": "LOVE "},
                    {**fact, "entity": "Caroline", "relation": "TupleReply", "object": "TupleReply"},
                    {**fact, "entity": "Caroline", "relation": "is aged", "object": "30"},
                    {**fact, "entity": "Caroline", "relation": "went to", "object": "a support group on 2023-05-07"},
                ],
            }
        )

    outcome = curator_for(ScriptedLLM(reply)).curate([make_session("s1", ["one", "two"])])[0]
    assert outcome.ok
    assert [e.title for e in outcome.result.episodes] == ["Adoption"]
    assert [(t.entity, t.object) for t in outcome.result.tuples] == [
        ("Caroline", "30"),
        ("Caroline", "a support group on 2023-05-07"),
    ]
    assert outcome.dropped_memories == [
        "episode 's1:0': only turn ids",
        "episode 'Support': a phrase repeated in a loop",
        "episode 'EpisodeReply': only the reply schema's name",
        "tuple 's1:0': entity: only turn ids",
        "tuple 'D3:1:1:1:1:1:1': entity: only turn ids",
        "tuple 'love': entity, relation and object are the same text",
        "tuple 'Caroline': relation: only the reply schema's name",
    ]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2023-05-07", "2023-05-07"),
        ("2023-05", "2023-05"),
        ("2023", "2023"),
        ("2023-05-07T10:00:00", "2023-05-07"),
        ("week of 2023-05-01", "2023-05-01"),  # a copied annotation
        ("~2023-05-05", "2023-05-05"),
        ("May 7, 2023", "2023-05-07"),
        ("7 May", "2023-05-07"),  # the session date fills the year
        ("2023-02-30", None),
        ("2023-13", None),
        ("last week", None),
        ("YYYY-MM-DD", None),
        ("", None),
    ],
)
def test_normalise_timestamp(value, expected):
    assert normalise_timestamp(value, SESSION_DATE.date()) == expected


def test_a_timestamp_that_is_no_date_falls_back_to_the_session_date():
    llm = ScriptedLLM(reply_citing(lambda shown: shown, timestamp="2023-02-30"))
    outcome = curator_for(llm).curate([make_session("s1", ["one"], started_at=SESSION_DATE + timedelta(days=3))])[0]
    assert outcome.ok
    assert outcome.result.episodes[0].timestamp == outcome.result.tuples[0].timestamp == "2023-05-11"
    assert outcome.timestamps_defaulted == 2


# --------------------------------------------------------------------------- failures and retries


def fails_above(max_turns: int, ok_reply: Callable[[LLMRequest], str]) -> Callable[[LLMRequest], str | LLMResult]:
    """Windows of more than ``max_turns`` turns fail, as a reply cut off at max_new_tokens does."""

    def reply(request: LLMRequest) -> str | LLMResult:
        if len(shown_turn_ids(request)) > max_turns:
            return LLMResult(
                text='{"episodes": [',
                error="reply does not match CurationReply (cut off at max_new_tokens)",
                prompt_tokens=100,
                completion_tokens=300,
                latency_s=2.0,
            )
        return ok_reply(request)

    return reply


def test_failed_windows_are_resent_split_in_half_in_one_batch_per_round():
    llm = ScriptedLLM(fails_above(2, reply_citing(lambda shown: shown)))
    outcome = curator_for(llm, retry_rounds=2).curate([make_session("s1", [f"turn {i}" for i in range(8)])])[0]
    assert [len(batch) for batch in llm.batches] == [1, 2, 4]
    assert [shown_turn_ids(r) for r in llm.batches[2]] == [
        ["s1:0", "s1:1"],
        ["s1:2", "s1:3"],
        ["s1:4", "s1:5"],
        ["s1:6", "s1:7"],
    ]
    assert outcome.ok
    assert outcome.windows == 1 and outcome.usage.requests == 7
    assert [e.source_turn_ids for e in outcome.result.episodes] == [
        ["s1:0", "s1:1"],
        ["s1:2", "s1:3"],
        ["s1:4", "s1:5"],
        ["s1:6", "s1:7"],
    ]
    # The failed attempts' tokens and time are part of the cost.
    assert outcome.usage.completion_tokens > 3 * 300 and outcome.usage.llm_s == pytest.approx(3 * 2.0 + 4 * 0.5)


def test_a_session_still_failing_after_the_retry_rounds_gets_an_error_and_others_are_unaffected():
    llm = ScriptedLLM(fails_above(1, reply_citing(lambda shown: shown)))
    sessions = [make_session("good", ["only turn"]), make_session("bad", [f"turn {i}" for i in range(8)])]
    good, bad = curator_for(llm, retry_rounds=1).curate(sessions)
    assert len(llm.batches) == 2  # the first attempt and one retry round
    assert good.ok and len(good.result.episodes) == 1
    assert bad.result is None
    assert "turns bad:0..bad:3" in bad.error and "turns bad:4..bad:7" in bad.error
    assert "cut off at max_new_tokens" in bad.error
    assert bad.usage.requests == 3 and bad.prompt_version == "curation-small/v2"


def test_no_retry_round_when_retry_rounds_is_zero():
    llm = ScriptedLLM(fails_above(0, reply_citing(lambda shown: shown)))
    [outcome] = curator_for(llm, retry_rounds=0).curate([make_session("s1", ["a", "b"])])
    assert len(llm.batches) == 1 and outcome.error and outcome.usage.requests == 1


def test_an_unreachable_backend_fails_the_sessions_without_raising():
    class DownLLM(ScriptedLLM):
        def generate(self, requests):
            self.batches.append(list(requests))
            raise LLMError("connection refused")

    llm = DownLLM(lambda request: "")
    outcomes = curator_for(llm).curate([make_session("s1", ["a"]), make_session("s2", ["b"])])
    assert all(o.result is None and "connection refused" in o.error for o in outcomes)


def test_a_context_too_small_for_the_prompt_is_a_clear_error():
    with pytest.raises(ValueError, match="context_tokens=512.*max_new_tokens=400"):
        curator_for(ScriptedLLM(lambda r: ""), llm_config=LLMConfig(context_tokens=512, max_new_tokens=400))


def test_the_demo_sessions_read_and_carry_relative_dates_to_annotate():
    from hybridmem_local.files.session_files import read_sessions_jsonl

    path = Path(hybridmem_local.__file__).parent / "examples" / "demo_sessions.jsonl"
    sessions = read_sessions_jsonl(path)
    assert len(sessions) == 3
    turn_ids = [t.turn_id for s in sessions for t in s.turns]
    assert len(turn_ids) == len(set(turn_ids))
    curator = curator_for(ScriptedLLM(reply_citing(lambda shown: shown)))
    for session in sessions:
        annotated = [
            line for line in curator.render_lines(session) if re.search(r" \[~?(week of |weekend of )?\d{4}", line)
        ]
        assert annotated, f"session {session.session_id} has no relative date to annotate"


# --------------------------------------------------------------------------- stored: provenance and duplicates

DEMO_REPLY = Path(__file__).resolve().parents[1] / "fixtures" / "smollm2_demo_s1_reply.json"


def demo_sessions() -> list[Session]:
    from hybridmem_local.files.session_files import read_sessions_jsonl

    return read_sessions_jsonl(Path(hybridmem_local.__file__).parent / "examples" / "demo_sessions.jsonl")


def replaying(reply: dict) -> ScriptedLLM:
    return ScriptedLLM(lambda request: json.dumps(reply))


def test_the_demo_case_of_smollm2_gives_one_row_per_memory_with_aligned_turns(tmp_path, minilm):
    """SmolLM2's real reply for demo session s1: one episode three times and one tuple six
    times, citing "13:56" and "2023-05-07". Stored: one row of each, led back to the turns."""
    reply = json.loads(DEMO_REPLY.read_text(encoding="utf-8"))["reply"]
    assert len(reply["episodes"]) == 3 and len(reply["tuples"]) == 6
    s1 = demo_sessions()[0]
    with HybridMemory.open(tmp_path / "m.db", embedder=minilm, llm=replaying(reply)) as memory:
        report = memory.ingest([s1])
        episodes, tuples = memory.list("default", kind="episode"), memory.list("default", kind="tuple")
        assert (len(episodes), len(tuples)) == (1, 1)
        (episode,), (fact,) = episodes, tuples
        assert episode.provenance == fact.provenance == "aligned"
        assert "s1:1" in episode.source_turn_ids  # "I ran the Riverside 10K ... in 52 minutes."
        assert fact.source_turn_ids and set(fact.source_turn_ids) <= {t.turn_id for t in s1.turns}
        assert (report.memories, report.duplicates_skipped, report.memories_aligned) == (2, 7, 9)
        history = memory.history(episode.id)
        assert [e.action for e in history] == ["add", "duplicate", "duplicate"]
        assert all("the same content" in e.reason for e in history[1:])
        hit = memory.search("How long did Bob need for the Riverside 10K?", namespace="default").episodes[0]
        assert hit.memory.provenance == "aligned" and hit.memory.source_turn_ids == episode.source_turn_ids
        exported = [json.loads(line) for line in memory.export_records("default") if '"memory"' in line]
        assert {m["provenance"] for m in exported} == {"aligned"}


def test_a_memory_repeated_in_a_later_session_gains_its_turns_and_an_event(tmp_path, hashing_embedder):
    first, second = demo_sessions()[:2]
    said = {
        "title": "Biscuit",
        "summary": "Alice's puppy",
        "details": "Alice has a beagle puppy named Biscuit.",
        "timestamp": "2023-05-05",
    }
    replies = {
        "s1": {"episodes": [{**said, "source_turn_ids": ["s1:4"]}], "tuples": []},
        # The same memory told again, citing a turn of the later session.
        "s2": {
            "episodes": [{**said, "details": "Alice has a beagle puppy named Biscuit!", "source_turn_ids": ["s2:0"]}],
            "tuples": [],
        },
    }
    llm = ScriptedLLM(lambda request: json.dumps(replies[shown_turn_ids(request)[0].split(":")[0]]))
    with HybridMemory.open(tmp_path / "m.db", embedder=hashing_embedder, llm=llm) as memory:
        memory.ingest([first])
        report = memory.ingest([second])
        (episode,) = memory.list("default")
        assert episode.source_turn_ids == ["s1:4", "s2:0"] and episode.provenance == "cited"
        assert (report.memories, report.duplicates_skipped) == (0, 1)
        event = memory.history(episode.id)[-1]
        assert event.action == "duplicate" and f"repeats memory {episode.id}" in event.reason
        assert json.loads(event.before["source_turn_ids"]) == ["s1:4"]


def test_memories_given_by_a_caller_are_stored_as_given(memory):
    """The guard is for curation: add_memories stores what it is given, repeats included."""
    from tests.factories import make_episode

    same = make_episode("Trip", "Alice went to Paris.")
    assert len(set(memory.add_memories("alice", episodes=[same, same]))) == 2


# --------------------------------------------------------------------------- SmolLM2 (real model)


class CountingLLM:
    """Wraps a real backend and records the size of every generate batch."""

    def __init__(self, inner):
        self.inner = inner
        self.model_id = inner.model_id
        self.batches: list[int] = []
        self.requests: list[LLMRequest] = []

    def count_tokens(self, text: str) -> int:
        return self.inner.count_tokens(text)

    def generate(self, requests):
        self.batches.append(len(requests))
        self.requests.extend(requests)
        return self.inner.generate(requests)


# SmolLM2 repeats itself until every string and list cap of the reply schema is full, so the
# reply budget must hold a full reply (~1.5k tokens with the default caps); its 8k context has
# room. The backend's own validation retries are left out: each attempt costs max_new_tokens.
# This is the config of the session's shared ``smollm2`` (conftest).
SMOLLM_CONFIG = LLMConfig(**SMOLLM2_CONFIG)


@pytest.fixture(scope="module")
def locomo_session(locomo_path):
    from hybridmem_local.eval.locomo import load_locomo

    return load_locomo(locomo_path).conversations[0].sessions[0]


@pytest.mark.slow
def test_smollm2_curates_a_locomo_session_into_memories_citing_its_turns(smollm2, locomo_session):
    llm = CountingLLM(smollm2)
    [outcome] = Curator(llm, SMOLLM_CONFIG, CurationConfig()).curate([locomo_session])
    print(
        f"\nSmolLM2 curation of {locomo_session.session_id} ({len(locomo_session.turns)} turns): "
        f"{outcome.usage.llm_s:.1f} s, {outcome.windows} window(s), {outcome.usage.requests} call(s), "
        f"{outcome.usage.prompt_tokens} prompt / {outcome.usage.completion_tokens} completion tokens, "
        f"{len(outcome.result.episodes) if outcome.result else 0} episodes, "
        f"{len(outcome.result.tuples) if outcome.result else 0} tuples, dropped ids {outcome.dropped_turn_ids}, "
        f"error {outcome.error}"
    )
    assert outcome.ok, outcome.error
    assert llm.batches[0] == outcome.windows  # the first round is one batched call
    result = CurationResult.model_validate(outcome.result.model_dump())
    session_ids = {t.turn_id for t in locomo_session.turns}
    for memory in [*result.episodes, *result.tuples]:
        assert set(memory.source_turn_ids) <= session_ids
        assert normalise_timestamp(memory.timestamp, locomo_session.started_at.date()) == memory.timestamp
    assert outcome.usage.prompt_tokens > 0 and outcome.usage.completion_tokens > 0 and outcome.usage.llm_s > 0
    assert outcome.usage.requests >= outcome.windows >= 1
    assert outcome.prompt_version == "curation-small/v2"


@pytest.mark.slow
def test_smollm2_windows_of_a_small_context_partition_the_session_in_one_call(smollm2, locomo_session):
    # Replies are cut off at 256 tokens (and fail): only the split and the batching are checked.
    # 1,088 tokens leave ~80 for turns after the prompt (748 since curation-small/v2) and the reply.
    small = SMOLLM_CONFIG.model_copy(update={"context_tokens": 1088, "max_new_tokens": 256})
    llm = CountingLLM(smollm2)
    curator = Curator(llm, small, CurationConfig(retry_rounds=0))
    windows = curator.windows(locomo_session)
    assert len(windows) >= 2
    assert [t for w in windows for t in w.turn_ids] == [t.turn_id for t in locomo_session.turns]
    [outcome] = curator.curate([locomo_session])
    assert llm.batches == [len(windows)]
    assert outcome.usage.requests == outcome.windows == len(windows)
    # Every window's prompt left room for the reply in the real model's context.
    for request in llm.requests:
        text = "\n".join(m.content for m in request.messages)
        assert smollm2.count_tokens(text) <= small.context_tokens - small.max_new_tokens


@pytest.mark.slow
def test_the_default_model_curates_the_facts_of_a_conversation(default_llm, minilm):
    """The embedded default writes memories worth having: tuples holding the named facts of the
    demo's first session and episodes keeping its numbers (issue #23; SmolLM2 wrote none)."""
    from hybridmem_local.cli.main import DEMO_SESSIONS
    from hybridmem_local.files.session_files import read_sessions_jsonl

    session = read_sessions_jsonl(DEMO_SESSIONS, "demo")[0]
    config = LLMConfig(n_threads=2, max_retries=0)
    [outcome] = Curator(default_llm, config, CurationConfig(), embed=minilm.embed).curate([session])
    assert outcome.ok, outcome.error
    result = outcome.result
    print(f"\n{default_llm.model_id}: {outcome.usage.llm_s:.0f} s, {outcome.usage.completion_tokens} completion tokens")
    for memory in [*result.episodes, *result.tuples]:
        print("  ", memory.model_dump(exclude={"provenance"}))
    facts = [" ".join((t.entity, t.relation, t.object)).lower() for t in result.tuples]
    named = {"biscuit", "riverside", "maria", "portland", "beagle", "dr. chen"}
    assert any(any(name in fact for name in named) for fact in facts), facts
    assert any("52" in e.details or "61" in e.details for e in result.episodes), [e.details for e in result.episodes]
    turn_ids = {t.turn_id for t in session.turns}
    assert all(m.source_turn_ids and set(m.source_turn_ids) <= turn_ids for m in [*result.episodes, *result.tuples])
