"""Whose is a memory (text/attribution.py): a memory's subject must be someone its cited turns speak of."""

from __future__ import annotations

from hybridmem_local.schema import EpisodeDraft, TupleDraft, Turn
from hybridmem_local.text.attribution import subjects, unsupported_subjects

PEOPLE = ["Gina", "Jon"]
GINA_NEWS = Turn(turn_id="D12:1", speaker="Gina", text="I got accepted for a fashion internship!")
JON_CONGRATS = Turn(turn_id="D12:2", speaker="Jon", text="That's awesome news about the fashion internship.")
JON_ASKS = Turn(turn_id="D11:15", speaker="Jon", text="How did the interview go?")
GINA_PHOTO = Turn(turn_id="D13:6", speaker="Gina", text="Look at this!", image_caption="a skeleton and a trophy")


def tuple_about(entity: str) -> TupleDraft:
    return TupleDraft(entity=entity, relation="got accepted for", object="a fashion internship", timestamp="2023-05-27")


def test_the_news_belongs_to_who_tells_it_in_the_first_person():
    assert unsupported_subjects(tuple_about("Gina"), [GINA_NEWS], PEOPLE) == set()
    assert unsupported_subjects(tuple_about("Jon"), [GINA_NEWS], PEOPLE) == {"Jon"}


def test_a_reply_without_i_supports_the_one_it_addresses_not_its_speaker():
    assert unsupported_subjects(tuple_about("Jon"), [JON_CONGRATS], PEOPLE) == {"Jon"}
    assert unsupported_subjects(tuple_about("Jon"), [JON_ASKS], PEOPLE) == {"Jon"}
    you = Turn(turn_id="D12:3", speaker="Jon", text="Congrats on your internship!")
    assert unsupported_subjects(tuple_about("Gina"), [you], PEOPLE) == set()  # "your", said to Gina
    # With three speakers "you" could be anyone: it supports nobody.
    assert unsupported_subjects(tuple_about("Gina"), [you], [*PEOPLE, "Maria"]) == {"Gina"}


def test_a_shared_image_and_a_name_count_and_a_memory_naming_nobody_is_not_checked():
    photo = TupleDraft(entity="Gina", relation="shares", object="photo", timestamp="2023-06-13")
    assert unsupported_subjects(photo, [GINA_PHOTO], PEOPLE) == set()
    assert unsupported_subjects(photo.model_copy(update={"entity": "Jon"}), [GINA_PHOTO], PEOPLE) == {"Jon"}
    named = Turn(turn_id="D1:1", speaker="Gina", text="Jon lost his job as a banker.")
    assert unsupported_subjects(tuple_about("Jon"), [named], PEOPLE) == set()
    episode = EpisodeDraft(title="The dance studio", summary="s", details="d", timestamp="2023-01-20")
    assert subjects(episode, PEOPLE) == set() and unsupported_subjects(episode, [], PEOPLE) == set()
    assert subjects(episode.model_copy(update={"title": "Jon's and Gina's plans"}), PEOPLE) == {"Gina", "Jon"}
