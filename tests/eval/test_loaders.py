"""Benchmark loaders: the LoCoMo dev file, LongMemEval fixtures, and precise errors on bad files."""

from __future__ import annotations

import copy
import json
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

import pytest

from hybridmem_local.errors import DatasetError
from hybridmem_local.eval.locomo import load_locomo, parse_session_date
from hybridmem_local.eval.longmemeval import load_longmemeval, namespace_for_question, parse_longmemeval_date
from hybridmem_local.files.session_files import read_locomo_sessions
from hybridmem_local.schema import NAMESPACE_PATTERN

REPO_ROOT = Path(__file__).resolve().parents[2]
LOCOMO_DEV = REPO_ROOT.parent / "shared" / "data" / "locomo" / "locomo_dev8.json"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
LONGMEMEVAL_SAMPLE = FIXTURES / "longmemeval_s_sample.json"
LONGMEMEVAL_MALFORMED = FIXTURES / "longmemeval_malformed.json"

needs_locomo_dev = pytest.mark.skipif(
    not LOCOMO_DEV.exists(),
    reason=f"LoCoMo dev file not found at {LOCOMO_DEV} (CC BY-NC data, kept outside the repository)",
)


def write_json(path: Path, data: object) -> Path:
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


# --------------------------------------------------------------------------- LoCoMo: dev file


@pytest.fixture(scope="module")
def locomo_dev():
    return load_locomo(LOCOMO_DEV)


@pytest.fixture(scope="module")
def locomo_raw():
    return json.loads(LOCOMO_DEV.read_text(encoding="utf-8"))


@needs_locomo_dev
def test_dev_file_counts(locomo_dev, locomo_raw):
    assert len(locomo_dev.conversations) == 8
    assert len(locomo_dev.questions()) == 1191
    assert {q.category for q in locomo_dev.questions()} == {1, 2, 3, 4}
    adversarial = sum(1 for sample in locomo_raw for qa in sample["qa"] if qa["category"] == 5)
    with_adversarial = load_locomo(LOCOMO_DEV, include_adversarial=True)
    assert len(with_adversarial.questions()) == 1191 + adversarial


@needs_locomo_dev
def test_dev_sessions_in_numeric_order_with_dates(locomo_dev, locomo_raw):
    conv = locomo_dev.conversations[0]
    raw_conv = locomo_raw[0]["conversation"]
    assert conv.sample_id == conv.namespace == "conv-26"
    assert (conv.speaker_a, conv.speaker_b) == (raw_conv["speaker_a"], raw_conv["speaker_b"])
    assert raw_conv["session_1_date_time"] == "1:56 pm on 8 May, 2023"
    assert conv.sessions[0].session_id == "conv-26:session_1"
    assert conv.sessions[0].started_at == datetime(2023, 5, 8, 13, 56, tzinfo=timezone.utc)
    # conv-26 lists dates for sessions 20-35 but has no turns for them.
    assert [s.session_id for s in conv.sessions] == [f"conv-26:session_{n}" for n in range(1, 20)]
    assert locomo_dev.empty_sessions_skipped >= 16
    for conversation in locomo_dev.conversations:
        dates = [s.started_at for s in conversation.sessions]
        assert dates == sorted(dates), conversation.sample_id
        assert {s.namespace for s in conversation.sessions} == {conversation.sample_id}


@needs_locomo_dev
def test_dev_turns_keep_dia_ids_and_image_captions(locomo_dev, locomo_raw):
    conv = locomo_dev.conversations[0]
    raw_turn = locomo_raw[0]["conversation"]["session_1"][4]
    turn = conv.sessions[0].turns[4]
    assert turn.turn_id == raw_turn["dia_id"] == "D1:5"
    assert turn.speaker == raw_turn["speaker"]
    assert turn.text == raw_turn["text"]
    assert turn.image_caption == raw_turn["blip_caption"]
    captions_in_file = sum(
        1
        for sample in locomo_raw
        for key, turns in sample["conversation"].items()
        if key.startswith("session_") and isinstance(turns, list)
        for t in turns
        if t.get("blip_caption")
    )
    captions_loaded = sum(1 for c in locomo_dev.conversations for s in c.sessions for t in s.turns if t.image_caption)
    assert captions_loaded == captions_in_file


@needs_locomo_dev
def test_dev_questions_cast_answers_and_name_categories(locomo_dev):
    by_id = {q.question_id: q for q in locomo_dev.questions()}
    sunrise = by_id["conv-26:qa1"]
    assert sunrise.question == "When did Melanie paint a sunrise?"
    assert sunrise.answer == "2022"  # an int in the file
    assert (sunrise.category, sunrise.category_name) == (2, "temporal")
    names = {q.category: q.category_name for q in locomo_dev.questions()}
    assert names == {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}


@needs_locomo_dev
def test_dev_evidence_is_normalised_and_issues_are_counted(locomo_dev):
    by_id = {q.question_id: q for q in locomo_dev.questions()}
    assert by_id["conv-26:qa37"].evidence == ["D8:6", "D9:17"]  # "D8:6; D9:17"
    assert "D11:26" in by_id["conv-43:qa18"].evidence  # "D:11:26"
    assert by_id["conv-49:qa31"].evidence == ["D9:1", "D4:4", "D4:6"]  # "D9:1 D4:4 D4:6"
    assert by_id["conv-42:qa88"].evidence == ["D1:18", "D1:20"]  # ["D1:18", "D", "D1:20"]
    assert Counter(i.kind for i in locomo_dev.evidence_issues) == {
        "split": 4,
        "repaired": 1,
        "unresolvable": 1,
        "dangling": 2,
    }
    # Every kept evidence id names a loaded turn of its conversation.
    for conversation in locomo_dev.conversations:
        turn_ids = {t.turn_id for s in conversation.sessions for t in s.turns}
        for question in conversation.questions:
            assert set(question.evidence) <= turn_ids, question.question_id


# --------------------------------------------------------------------------- LoCoMo: synthetic file


def locomo_sample() -> dict:
    """A tiny conversation in the official format, with session numbers out of order."""
    return {
        "sample_id": "conv-x",
        "conversation": {
            "speaker_a": "Ann",
            "speaker_b": "Bo",
            "session_10_date_time": "12:09 am on 3 June, 2023",
            "session_10": [{"speaker": "Ann", "dia_id": "D10:1", "text": "Back from Lisbon!"}],
            "session_1_date_time": "9:15 am on 1 May, 2023",
            "session_1": [
                {"speaker": "Ann", "dia_id": "D1:1", "text": "I adopted a cat."},
                {"speaker": "Bo", "dia_id": "D1:2", "text": "", "blip_caption": "a photo of a cat", "img_url": ["u"]},
                {"speaker": "Bo", "dia_id": "D1:3", "text": "  "},
            ],
            "session_2_date_time": "3:00 pm on 20 May, 2023",
            "session_2": [],
        },
        "qa": [
            {"question": "What pet did Ann adopt?", "answer": "a cat", "evidence": ["D1:01"], "category": 4},
            {"question": "Did Bo adopt a dog?", "adversarial_answer": "Yes", "evidence": ["D1:2"], "category": 5},
            {"question": "When was Ann in Lisbon?", "answer": 2023, "evidence": [], "category": 2},
        ],
    }


def test_synthetic_locomo_orders_sessions_and_skips_empty_ones(tmp_path):
    dataset = load_locomo(write_json(tmp_path / "l.json", [locomo_sample()]), namespace_prefix="run1.")
    conv = dataset.conversations[0]
    assert conv.namespace == "run1.conv-x"
    assert [s.session_id for s in conv.sessions] == ["conv-x:session_1", "conv-x:session_10"]
    assert conv.sessions[1].started_at == datetime(2023, 6, 3, 0, 9, tzinfo=timezone.utc)
    assert [t.turn_id for t in conv.sessions[0].turns] == ["D1:1", "D1:2"]  # D1:3 is blank
    assert conv.sessions[0].turns[1].image_caption == "a photo of a cat"
    assert (dataset.empty_sessions_skipped, dataset.empty_turns_skipped) == (1, 1)
    assert [q.question_id for q in conv.questions] == ["conv-x:qa0", "conv-x:qa2"]
    assert conv.questions[0].evidence == ["D1:1"]
    assert Counter(i.kind for i in dataset.evidence_issues) == {"repaired": 1}
    assert conv.questions[1].answer == "2023"


def test_synthetic_locomo_adversarial_questions_on_request(tmp_path):
    dataset = load_locomo(write_json(tmp_path / "l.json", [locomo_sample()]), include_adversarial=True)
    adversarial = dataset.conversations[0].questions[1]
    assert (adversarial.category_name, adversarial.answer, adversarial.adversarial_answer) == (
        "adversarial",
        None,
        "Yes",
    )


def test_conversation_moves_to_another_namespace(tmp_path):
    path = write_json(tmp_path / "l.json", [locomo_sample()])
    moved = read_locomo_sessions(path, "bench")
    assert {s.namespace for s in moved} == {"bench"}
    assert read_locomo_sessions(path)[0].namespace == "conv-x"
    with pytest.raises(ValueError, match="invalid namespace"):
        read_locomo_sessions(path, "no spaces")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("1:56 pm on 8 May, 2023", datetime(2023, 5, 8, 13, 56, tzinfo=timezone.utc)),
        ("12:09 am on 13 September, 2023", datetime(2023, 9, 13, 0, 9, tzinfo=timezone.utc)),
        ("12:30 pm on 1 Jan, 2024", datetime(2024, 1, 1, 12, 30, tzinfo=timezone.utc)),
    ],
)
def test_parse_session_date(value, expected):
    assert parse_session_date(value) == expected


@pytest.mark.parametrize("value", ["yesterday", "13:10 pm on 8 May, 2023", "1:56 pm on 8 Mayo, 2023"])
def test_parse_session_date_rejects_other_formats(value):
    with pytest.raises(ValueError, match="date"):
        parse_session_date(value)


def _mutate(fn):
    def build():
        sample = locomo_sample()
        fn(sample)
        return [sample]

    return build


def _set(obj, key, value):
    obj[key] = value


LOCOMO_MALFORMED = [
    (
        "missing dia_id",
        _mutate(lambda s: s["conversation"]["session_1"][0].pop("dia_id")),
        "sample 0 (conv-x) session_1 turn 0: field 'dia_id': Field required",
    ),
    (
        "text not a string",
        _mutate(lambda s: _set(s["conversation"]["session_10"][0], "text", 5)),
        "sample 0 (conv-x) session_10 turn 0: field 'text'",
    ),
    (
        "duplicate dia_id",
        _mutate(lambda s: _set(s["conversation"]["session_10"][0], "dia_id", "D1:1")),
        "session_10 turn 0: field 'dia_id': 'D1:1' already used in session_1",
    ),
    (
        "bad date",
        _mutate(lambda s: _set(s["conversation"], "session_1_date_time", "May 1st")),
        "session_1: field 'conversation.session_1_date_time': date 'May 1st'",
    ),
    (
        "turns without date",
        _mutate(lambda s: s["conversation"].pop("session_10_date_time")),
        "session_10: field 'conversation.session_10_date_time': missing",
    ),
    (
        "session not a list",
        _mutate(lambda s: _set(s["conversation"], "session_10", {"a": 1})),
        "field 'conversation.session_10': expected a list of turns",
    ),
    (
        "missing speaker_b",
        _mutate(lambda s: s["conversation"].pop("speaker_b")),
        "sample 0 (conv-x): field 'conversation.speaker_b'",
    ),
    ("missing sample_id", _mutate(lambda s: s.pop("sample_id")), "sample 0: field 'sample_id'"),
    (
        "evidence not a list",
        _mutate(lambda s: _set(s["qa"][0], "evidence", "D1:1")),
        "sample 0 (conv-x) qa 0: field 'evidence'",
    ),
    ("category out of range", _mutate(lambda s: _set(s["qa"][2], "category", 7)), "qa 2: field 'category'"),
    (
        "answer missing",
        _mutate(lambda s: s["qa"][0].pop("answer")),
        "qa 0: field 'answer': missing for a category-4 question",
    ),
    ("qa not a list", _mutate(lambda s: _set(s, "qa", None)), "sample 0 (conv-x): field 'qa'"),
    ("sample not an object", lambda: ["conv-x"], "sample 0: expected an object, got str"),
    ("duplicate sample", lambda: [locomo_sample(), locomo_sample()], "sample_id 'conv-x' appears twice"),
    ("top level object", lambda: {"conv-x": locomo_sample()}, "top level must be a JSON list"),
]


@pytest.mark.parametrize(("case", "build", "message"), LOCOMO_MALFORMED, ids=[c[0] for c in LOCOMO_MALFORMED])
def test_malformed_locomo_errors_say_where(tmp_path, case, build, message):
    path = write_json(tmp_path / "locomo.json", build())
    with pytest.raises(DatasetError) as excinfo:
        load_locomo(path)
    assert str(excinfo.value).startswith(str(path))
    assert message in str(excinfo.value)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'[{"sample_id": "conv-\xff"}]', "not UTF-8 text: byte 0xff at offset 21"),
        (b'[{"sample_id": ', "not valid JSON"),
    ],
    ids=["non-utf8", "not-json"],
)
def test_unreadable_locomo_files(tmp_path, content, message):
    path = tmp_path / "locomo.json"
    path.write_bytes(content)
    with pytest.raises(DatasetError, match=message):
        load_locomo(path)


def test_missing_file_is_named(tmp_path):
    with pytest.raises(DatasetError, match="nope.json: cannot read file"):
        load_locomo(tmp_path / "nope.json")


# --------------------------------------------------------------------------- LongMemEval


@pytest.fixture(scope="module")
def lme():
    return load_longmemeval(LONGMEMEVAL_SAMPLE)


def test_longmemeval_instances(lme):
    by_id = {i.question_id: i for i in lme.instances}
    assert list(by_id) == ["e47becba", "6a1eabeb", "gpt4_2f8be40d_abs", "0a995998"]
    first = by_id["e47becba"]
    assert first.namespace == "e47becba"
    assert first.question_type == "single-session-user"
    assert first.question_date == datetime(2023, 5, 30, 23, 40, tzinfo=timezone.utc)
    assert [s.session_id for s in first.sessions] == ["sharegpt_yywfGR7_0", "answer_280352e9"]
    assert first.sessions[1].started_at == datetime(2023, 5, 25, 10, 4, tzinfo=timezone.utc)
    assert {s.namespace for s in first.sessions} == {"e47becba"}
    assert [t.speaker for t in first.sessions[0].turns] == ["user", "assistant"]
    # The empty third turn is skipped; turn ids keep the file's index.
    assert [t.turn_id for t in first.sessions[1].turns] == [
        "answer_280352e9:0",
        "answer_280352e9:1",
        "answer_280352e9:3",
    ]
    assert first.evidence_turn_ids == ["answer_280352e9:0"]
    assert first.answer_session_ids == ["answer_280352e9"]
    assert lme.empty_turns_skipped == 1


def test_longmemeval_knowledge_update_and_abstention(lme):
    by_id = {i.question_id: i for i in lme.instances}
    update = by_id["6a1eabeb"]
    assert update.question_type == "knowledge-update"
    assert update.evidence_turn_ids == ["answer_8748f791_1:0", "answer_8748f791_2:0"]
    assert [s.started_at.month for s in update.sessions] == [8, 9, 9]
    assert [i.question_id for i in lme.instances if i.is_abstention] == ["gpt4_2f8be40d_abs"]
    assert by_id["0a995998"].answer == "2"  # an int in the file


def test_longmemeval_limit_and_prefix():
    dataset = load_longmemeval(LONGMEMEVAL_SAMPLE, limit=2, namespace_prefix="lme.")
    assert [i.namespace for i in dataset.instances] == ["lme.e47becba", "lme.6a1eabeb"]


def test_longmemeval_malformed_fixture_names_instance_session_turn_and_field():
    with pytest.raises(DatasetError) as excinfo:
        load_longmemeval(LONGMEMEVAL_MALFORMED)
    assert str(excinfo.value) == (
        f"{LONGMEMEVAL_MALFORMED}: instance 1 (6a1eabeb) session 2 (answer_8748f791_2) turn 0: "
        "field 'content': Field required"
    )


def test_longmemeval_skips_repeated_haystack_sessions(tmp_path):
    instances = json.loads(LONGMEMEVAL_SAMPLE.read_text())
    first = instances[0]
    first["haystack_session_ids"].append(first["haystack_session_ids"][0])
    first["haystack_dates"].append(first["haystack_dates"][0])
    first["haystack_sessions"].append(first["haystack_sessions"][0])
    dataset = load_longmemeval(write_json(tmp_path / "lme.json", instances))
    assert dataset.duplicate_sessions_skipped == 1
    assert len(dataset.instances[0].sessions) == 2


def _lme_mutation(fn):
    def build():
        instances = json.loads(LONGMEMEVAL_SAMPLE.read_text())
        fn(instances)
        return instances

    return build


LONGMEMEVAL_MALFORMED_CASES = [
    (
        "bad role",
        _lme_mutation(lambda d: _set(d[0]["haystack_sessions"][1][1], "role", "system")),
        "instance 0 (e47becba) session 1 (answer_280352e9) turn 1: field 'role'",
    ),
    (
        "has_answer not bool",
        _lme_mutation(lambda d: _set(d[1]["haystack_sessions"][0][0], "has_answer", "yes")),
        "instance 1 (6a1eabeb) session 0 (answer_8748f791_1) turn 0: field 'has_answer'",
    ),
    (
        "unknown question type",
        _lme_mutation(lambda d: _set(d[2], "question_type", "trivia")),
        "instance 2 (gpt4_2f8be40d_abs): field 'question_type'",
    ),
    (
        "missing answer_session_ids",
        _lme_mutation(lambda d: d[3].pop("answer_session_ids")),
        "instance 3 (0a995998): field 'answer_session_ids': Field required",
    ),
    (
        "haystack lengths differ",
        _lme_mutation(lambda d: d[1]["haystack_dates"].pop()),
        "instance 1 (6a1eabeb): haystack lists differ in length",
    ),
    (
        "bad question date",
        _lme_mutation(lambda d: _set(d[0], "question_date", "2023-05-30")),
        "instance 0 (e47becba): field 'question_date': date '2023-05-30'",
    ),
    (
        "bad session date",
        _lme_mutation(lambda d: _set(d[0]["haystack_dates"], 1, "2023/02/30 (Thu) 10:04")),
        "session 1 (answer_280352e9): field 'haystack_dates.1': date '2023/02/30 (Thu) 10:04': day is out of range",
    ),
    (
        "duplicate question",
        _lme_mutation(lambda d: d.append(copy.deepcopy(d[0]))),
        "instance 4 (e47becba): namespace 'e47becba' already used by question 'e47becba'",
    ),
    ("top level object", lambda: {"instances": []}, "top level must be a JSON list"),
]


@pytest.mark.parametrize(
    ("case", "build", "message"), LONGMEMEVAL_MALFORMED_CASES, ids=[c[0] for c in LONGMEMEVAL_MALFORMED_CASES]
)
def test_malformed_longmemeval_errors_say_where(tmp_path, case, build, message):
    path = write_json(tmp_path / "lme.json", build())
    with pytest.raises(DatasetError) as excinfo:
        load_longmemeval(path)
    assert message in str(excinfo.value)


def test_parse_longmemeval_date():
    assert parse_longmemeval_date("2023/05/30 (Tue) 23:40") == datetime(2023, 5, 30, 23, 40, tzinfo=timezone.utc)


def test_namespace_for_question_is_safe_and_distinct():
    assert namespace_for_question("gpt4_2655b836") == "gpt4_2655b836"
    odd = [namespace_for_question("q/1 x"), namespace_for_question("q 1/x"), namespace_for_question("x" * 80)]
    assert all(NAMESPACE_PATTERN.match(ns) for ns in odd)
    assert len(set(odd)) == 3
