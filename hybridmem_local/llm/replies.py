"""What every backend shares: raw replies, ``<think>`` stripping, validation and bounded retries.

A backend only has to turn a batch of requests into raw :class:`Completion` objects
(``ChatBackend._complete``). :func:`generate_with_retries` then checks each reply against the
request's schema and sends the failures back, with the validation error in a follow-up
message, until they pass or ``max_retries`` is spent. Constrained backends rarely need it (a
reply cut off at ``max_new_tokens`` is the usual case); a server that ignores the schema does.
"""

from __future__ import annotations

import json
import re
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ValidationError

from hybridmem_local.config import LLMConfig
from hybridmem_local.llm.base import ChatMessage, LLMRequest, LLMResult

#: The follow-up turn that asks for a corrected reply. Part of the LLM layer's behaviour, not a
#: stage prompt: it only restates the schema the stage's prompt already asked for.
RETRY_FEEDBACK = (
    "Your reply could not be used: {error}\n"
    "Answer again with only a JSON object that validates against this JSON schema:\n{schema}"
)

_THINK_BLOCK = re.compile(r"<think>.*?(</think>|\Z)", re.DOTALL)
_CODE_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)


@dataclass
class Completion:
    """One raw reply from a model or server, before validation."""

    text: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    #: A failure to get a reply at all (timeout, refused connection, server error).
    error: str | None = None
    #: The same request would fail again (e.g. the prompt exceeds the context window).
    permanent: bool = False
    #: Generation stopped at max_new_tokens.
    truncated: bool = False
    #: The backend's repetition guard stopped a reply that had begun to loop.
    looped: bool = False


def strip_think(text: str) -> str:
    """Drop Qwen3-style reasoning: ``<think>…</think>`` blocks, an unterminated one at the end,
    and everything before a lone ``</think>`` (the template opened the block in the prompt)."""
    if "</think>" in text and "<think>" not in text.split("</think>", 1)[0]:
        text = text.split("</think>", 1)[1]
    return _THINK_BLOCK.sub("", text).strip()


def check_reply(text: str, schema: type[BaseModel] | None) -> tuple[BaseModel | None, str | None]:
    """Validate a (think-stripped) reply: ``(instance, None)`` when usable, else ``(None, why)``."""
    if not text:
        return None, "empty reply"
    if schema is None:
        return None, None
    fenced = _CODE_FENCE.match(text)
    if fenced:
        text = fenced.group(1)
    try:
        return schema.model_validate_json(text), None
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in err['loc']) or '(root)'}: {err['msg']}" for err in exc.errors()[:5]
        )
        return None, f"reply does not match {schema.__name__}: {problems}"


#: How many cut points, from the last one back, :func:`salvage` tries before giving up.
_SALVAGE_TRIES = 64


def _cut_points(text: str) -> list[tuple[int, str]]:
    """Where ``text`` (JSON cut off somewhere) could end: after each complete element of an
    array, and just inside each ``[``; with the closing brackets that make it whole there."""
    points: list[tuple[int, str]] = []
    stack: list[str] = []
    in_string = escaped = False
    closers = {"{": "}", "[": "]"}
    for i, char in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
                if stack and stack[-1] == "[":
                    points.append((i + 1, "".join(closers[c] for c in reversed(stack))))
            continue
        if char == '"':
            in_string = True
        elif char in "{[":
            stack.append(char)
            if char == "[":
                points.append((i + 1, "".join(closers[c] for c in reversed(stack))))
        elif char in "}]":
            if not stack or closers[stack.pop()] != char:
                break  # not JSON any more: nothing after this can be closed
            if stack and stack[-1] == "[":
                points.append((i + 1, "".join(closers[c] for c in reversed(stack))))
    return points


def salvage(text: str, schema: type[BaseModel]) -> tuple[BaseModel, str] | None:
    """The complete items of a reply cut off mid-way: ``text`` closed after its last complete
    list element (trying earlier ones while that does not validate), with required lists the
    reply never reached given as empty. ``(instance, closed JSON)``, or None when not one item
    was complete (the request then fails as a cut-off reply does, and is retried)."""
    fenced = re.match(r"^```(?:json)?\s*", text)
    if fenced:
        text = text[fenced.end() :]
    required_lists = [
        name
        for name, spec in schema_json(schema).get("properties", {}).items()
        if spec.get("type") == "array" and name in schema_json(schema).get("required", [])
    ]
    for end, closing in reversed(_cut_points(text)[-_SALVAGE_TRIES:]):
        try:
            data = json.loads(text[:end] + closing)
        except json.JSONDecodeError:
            continue
        if not isinstance(data, dict):
            continue
        for name in required_lists:
            data.setdefault(name, [])
        if not any(isinstance(value, list) and value for value in data.values()):
            return None  # nothing complete: earlier cut points hold even less
        try:
            instance = schema.model_validate(data)
        except ValidationError:
            continue
        return instance, json.dumps(data, ensure_ascii=False)
    return None


def schema_json(schema: type[BaseModel]) -> dict:
    """The JSON schema a backend constrains to (and the cache keys on)."""
    return schema.model_json_schema()


#: How much of a failed reply a retry quotes back. Enough to show a mistake; quoted whole, a
#: reply cut off at max_new_tokens would push the retry's prompt past the context window.
FEEDBACK_REPLY_CHARS = 1000


def feedback_request(request: LLMRequest, reply: str, error: str) -> LLMRequest:
    """``request`` again, followed by its failed reply (clipped) and why it could not be used."""
    assert request.output_schema is not None
    feedback = RETRY_FEEDBACK.format(error=error, schema=json.dumps(schema_json(request.output_schema)))
    if len(reply) > FEEDBACK_REPLY_CHARS:
        reply = f"{reply[:FEEDBACK_REPLY_CHARS]} … ({len(reply) - FEEDBACK_REPLY_CHARS} more characters cut)"
    messages = [
        *request.messages,
        ChatMessage(role="assistant", content=reply),
        ChatMessage(role="user", content=feedback),
    ]
    return request.model_copy(update={"messages": messages})


def generate_with_retries(
    requests: Sequence[LLMRequest],
    complete: Callable[[list[LLMRequest]], list[Completion]],
    max_retries: int,
    backoff_s: float = 0.5,
) -> list[LLMResult]:
    """Run ``complete`` on the batch, then again on the requests whose reply failed, at most
    ``max_retries`` more times. Token counts and latency add up over all attempts."""
    results: list[LLMResult | None] = [None] * len(requests)
    attempts = list(requests)
    totals = [Completion() for _ in requests]
    last_reply = [""] * len(requests)
    last_error = [""] * len(requests)
    pending = list(range(len(requests)))
    for attempt in range(max_retries + 1):
        if attempt and any(totals[i].error for i in pending):
            time.sleep(backoff_s * 2 ** (attempt - 1))  # give a restarting server a moment
        replies = complete([attempts[i] for i in pending])
        still_pending = []
        for i, reply in zip(pending, replies, strict=True):
            total = totals[i]
            total.prompt_tokens += reply.prompt_tokens
            total.completion_tokens += reply.completion_tokens
            total.latency_s += reply.latency_s
            total.error = reply.error
            if reply.error is not None:
                last_reply[i], last_error[i] = reply.text, reply.error
                if not reply.permanent:
                    still_pending.append(i)
                continue
            text = strip_think(reply.text)
            schema = requests[i].output_schema
            parsed, problem = check_reply(text, schema)
            salvaged = None
            if (
                problem is not None
                and schema is not None
                and requests[i].salvage_partial
                and (reply.truncated or reply.looped)
            ):
                salvaged = salvage(text, schema)
            if problem is None or salvaged is not None:
                if salvaged is not None:
                    parsed, text = salvaged
                results[i] = LLMResult(
                    text=text,
                    parsed=parsed,
                    prompt_tokens=total.prompt_tokens,
                    completion_tokens=total.completion_tokens,
                    latency_s=total.latency_s,
                    salvaged=salvaged is not None,
                )
                continue
            assert problem is not None
            if reply.truncated or reply.looped:
                problem += " (cut off at max_new_tokens)" if reply.truncated else " (stopped: it began to loop)"
            last_reply[i], last_error[i] = text, problem
            still_pending.append(i)
            if requests[i].output_schema is not None:
                attempts[i] = feedback_request(requests[i], text, problem)
        pending = still_pending
        if not pending:
            break
    return [
        result
        if result is not None
        else LLMResult(
            text=last_reply[i],
            prompt_tokens=totals[i].prompt_tokens,
            completion_tokens=totals[i].completion_tokens,
            latency_s=totals[i].latency_s,
            error=last_error[i],
        )
        for i, result in enumerate(results)
    ]


class ChatBackend(ABC):
    """Base of the built-in backends: ``generate`` = ``_complete`` + validation + retries."""

    #: Requests the call cache sends per call and commits together: what a killed run can
    #: lose, traded against the batch the engine sees (see ``CachedLLM``).
    cache_chunk_size: int = 32

    def __init__(self, config: LLMConfig):
        self.config = config
        self.model_id = f"{config.backend}:{config.model}"

    def generate(self, requests: Sequence[LLMRequest]) -> list[LLMResult]:
        if not requests:
            return []
        return generate_with_retries(requests, self._complete, self.config.max_retries)

    def max_new_tokens(self, request: LLMRequest) -> int:
        return request.max_new_tokens or self.config.max_new_tokens

    @abstractmethod
    def _complete(self, requests: list[LLMRequest]) -> list[Completion]:
        """One attempt for each request, in order; failures go in ``Completion.error``."""

    @abstractmethod
    def count_tokens(self, text: str) -> int: ...

    def close(self) -> None:  # noqa: B027 - deliberately empty: most backends hold nothing to free early
        """Nothing to free by default: the weights go with the object."""
