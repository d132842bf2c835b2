"""JSON-constrained decoding with llguidance, shared by the in-process backends.

The llama.cpp backend drives llguidance matchers itself (one per sequence of a batch, with
jump-forward of forced tokens: ``llm/llama_batch.py``); the transformers backend goes through
Outlines' llguidance logits processors. Both constrain to the same grammar, :func:`json_grammar`.
llguidance does the constraining: it walks the schema's grammar lazily, per
token, so a schema costs ~1 ms and a few MB whatever its caps. Outlines' default backend
(outlines_core) compiles a schema into a token-level automaton up front instead, with a state
per character of every bounded string and maxItems unrolled: the curation reply's took 4.3 GB
and 65 s for SmolLM2's vocabulary, growing linearly with the caps.
"""

from __future__ import annotations

import json
import warnings
from typing import TYPE_CHECKING

from pydantic import BaseModel

from hybridmem_local.llm.replies import schema_json

if TYPE_CHECKING:  # Outlines imports torch and its engines: only when a backend is built
    from outlines.backends.llguidance import LLGuidanceLogitsProcessor
    from outlines.models import SteerableModel

#: Whitespace allowed between JSON tokens: one optional space. Small models left free to emit
#: whitespace can loop on newlines until max_new_tokens.
JSON_WHITESPACE = r"[ ]?"


class OutlinesProcessors:
    """The JSON-schema logits processors of one loaded model, built once per schema.

    A processor carries the state of the request it is constraining (``reset`` before each),
    so one backend must not generate twice at the same time; the backends run one call at a
    time (the service serialises its one LLM). Processors live with their backend: the llama.cpp
    tokenizer llguidance builds points into that model's vocabulary.
    """

    def __init__(self, outlines_model: SteerableModel):
        from outlines.backends import LLGuidanceBackend

        # Converts the vocabulary once (~0.3 s for SmolLM2); each schema then costs ~1 ms. The
        # llama.cpp conversion calls a deprecated llama.cpp function once per token.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            self._backend = LLGuidanceBackend(outlines_model)
        self._built: dict[str, LLGuidanceLogitsProcessor] = {}

    def get(self, schema: type[BaseModel]) -> LLGuidanceLogitsProcessor:
        key = json.dumps(schema_json(schema))
        if key not in self._built:
            self._built[key] = self._backend.get_json_schema_logits_processor(json_grammar(schema))
        return self._built[key]


def json_grammar(schema: type[BaseModel]) -> str:
    """The JSON schema a reply is constrained to, as llguidance reads it: every object closed to
    its declared properties, and llguidance's JSON options in the schema (Outlines'
    whitespace_pattern argument is for outlines_core only)."""
    closed = _closed(schema_json(schema))
    return json.dumps({**closed, "x-guidance": {"whitespace_pattern": JSON_WHITESPACE}})


def _closed(node):
    """``node`` with every object limited to its declared properties. llguidance follows JSON
    Schema, where unlisted properties are allowed, and a small model then invents keys (a
    random one loops on them until max_new_tokens); outlines_core wrote only declared ones."""
    if isinstance(node, list):
        return [_closed(item) for item in node]
    if not isinstance(node, dict):
        return node
    closed = {key: _closed(value) for key, value in node.items()}
    if closed.get("type") == "object" and "properties" in closed:
        closed.setdefault("additionalProperties", False)
    return closed
