"""Whose is a memory (text/attribution.py): a memory's subject must be someone its cited turns speak of."""

from __future__ import annotations

from hybridmem_local.schema import EpisodeDraft, TupleDraft, Turn
from hybridmem_local.text.attribution import (
    mentions,
    misattributed,
    stating_turns,
    subjects,
    unsupported_subjects,
)

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


# --------------------------------------------------------------------------- the stating turn

SESSION = [
    Turn(
        turn_id="D12:1",
        speaker="Gina",
        text="Hey Jon! Long time no talk! I just got accepted for a fashion internship!",
    ),
    Turn(turn_id="D12:2", speaker="Jon", text="Congrats, Gina! I knew you'd make it. So stoked for you."),
    Turn(turn_id="D12:3", speaker="Jon", text="I'm reading a book about startups for my dance studio."),
]


def test_the_partners_news_cited_from_a_congratulation_is_flagged():
    """The 1.5B curator's commonest error: Gina's news, the memory citing Jon's reply, Jon made its
    subject. Jon speaks the cited reply in the first person, so the old check passes it; the turn
    that states the internship is Gina's own news, so the new one flags it."""
    jons = tuple_about("Jon")
    assert unsupported_subjects(jons, [SESSION[1]], PEOPLE) == set()
    assert [t.turn_id for t in stating_turns(jons, SESSION, PEOPLE)] == ["D12:1"]
    assert misattributed(jons, SESSION, PEOPLE) == {"Jon"}
    episode = EpisodeDraft(
        title="Jon's internship",
        summary="Jon got accepted for a fashion internship.",
        details="d",
        timestamp="2023-05-27",
    )
    assert misattributed(episode, SESSION, PEOPLE) == {"Jon"}


def test_the_subjects_own_statement_and_a_turn_naming_the_subject_are_not_flagged():
    assert misattributed(tuple_about("Gina"), SESSION, PEOPLE) == set()
    studio = TupleDraft(entity="Jon", relation="is reading", object="a book about startups", timestamp="2023-05-27")
    assert misattributed(studio, SESSION, PEOPLE) == set()
    # Gina speaks in the first person, but of Jon by name: his news, told by her.
    told = Turn(turn_id="D1:1", speaker="Gina", text="Jon told me he got accepted for a fashion internship!")
    assert mentions(told.text, "Jon")
    assert misattributed(tuple_about("Jon"), [told, *SESSION[1:]], PEOPLE) == set()


def test_a_name_used_to_address_someone_does_not_make_the_turn_about_them():
    assert not mentions("Hey Jon! I got accepted for a fashion internship!", "Jon")
    assert not mentions("Thanks, Jon. Sourcing pieces for my store was a struggle.", "Jon")
    assert not mentions("Jon, you won't believe it!", "Jon")
    assert mentions("I told Jon about the internship.", "Jon")
    assert mentions("Proud of Jon for opening the studio!", "Jon")


def test_a_reply_spoken_only_to_the_subject_does_not_flag_it():
    """Gina's congratulation, not in the first person, is about Jon: nothing flags his memory."""
    congrats = Turn(turn_id="D1:2", speaker="Gina", text="Congrats on getting accepted for the fashion internship!")
    assert stating_turns(tuple_about("Jon"), [congrats], PEOPLE) == [congrats]
    assert misattributed(tuple_about("Jon"), [congrats], PEOPLE) == set()


def test_a_shared_image_is_the_sharers_own():
    photo = Turn(
        turn_id="D13:6", speaker="Gina", text="Look!", image_caption="a skeleton and a trophy on a black cloth"
    )
    shares = TupleDraft(
        entity="Jon", relation="shares", object="a photo of a skeleton and a trophy", timestamp="2023-06-13"
    )
    assert misattributed(shares, [photo], PEOPLE) == {"Jon"}
    assert misattributed(shares.model_copy(update={"entity": "Gina"}), [photo], PEOPLE) == set()


def test_memories_about_nobody_or_everybody_or_stated_nowhere_are_not_checked():
    nobody = EpisodeDraft(
        title="The fashion internship", summary="An internship was accepted.", details="d", timestamp="2023-05-27"
    )
    assert stating_turns(nobody, SESSION, PEOPLE) == [SESSION[0]]
    assert misattributed(nobody, SESSION, PEOPLE) == set()
    both = nobody.model_copy(update={"title": "Jon's and Gina's fashion internship"})
    assert misattributed(both, SESSION, PEOPLE) == set()
    # One shared word ("fashion") is no evidence of which turn states the memory.
    vague = TupleDraft(entity="Jon", relation="likes", object="fashion", timestamp="2023-05-27")
    assert stating_turns(vague, SESSION, PEOPLE) == []
    assert misattributed(vague, SESSION, PEOPLE) == set()
    assert misattributed(tuple_about("Jon"), [], PEOPLE) == set()
