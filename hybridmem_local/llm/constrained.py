"""JSON-constrained decoding with Outlines, shared by the in-process backends (llama.cpp, transformers)."""

from __future__ import annotations

import json

from pydantic import BaseModel

from hybridmem_local.llm.replies import schema_json

#: Whitespace allowed between JSON tokens: one optional space. Small models left free to emit
#: whitespace can loop on newlines until max_new_tokens.
JSON_WHITESPACE = r"[ ]?"

#: (model file, schema JSON) → processor, for the whole process: building a schema's index is
#: the expensive part of constraining (the curation reply's takes ~90 s and ~4 GB resident for
#: SmolLM2's vocabulary), and every backend instance of one model file (the eval runner's, the
#: store's, a test's) can use the same one.
_BUILT: dict[tuple[str, str], object] = {}


class OutlinesProcessors:
    """The JSON-schema logits processors of one model file, built once per schema and process.

    A processor carries the state of the request it is constraining (``reset`` before each),
    so the instances of one model file must not generate at the same time; the backends run
    one call at a time (the service serialises its one LLM).
    """

    def __init__(self, outlines_model: object, model_file: str):
        self.outlines_model = outlines_model
        self.model_file = model_file

    def get(self, schema: type[BaseModel]):
        from outlines.backends import get_json_schema_logits_processor

        key = (self.model_file, json.dumps(schema_json(schema)))
        if key not in _BUILT:
            _BUILT[key] = get_json_schema_logits_processor(
                None, self.outlines_model, key[1], whitespace_pattern=JSON_WHITESPACE
            )
        return _BUILT[key]
