"""Bounds and response models the HTTP API and the MCP tools share (pydantic only: cheap to import)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from hybridmem_local.schema import Episode, RelationalTuple, StrictModel

#: Largest ``k`` a search or ask may ask for (2k tuples come with it); beyond it answers 422.
MAX_K = 100
#: Largest page of ``GET .../memories``.
MAX_PAGE = 1000
#: Sessions one batch request may carry (the pending-queue bound applies on top).
MAX_BATCH = 100
#: Longest query or question accepted.
MAX_QUERY_CHARS = 10_000

MemoryOut = Annotated[Episode | RelationalTuple, Field(discriminator="kind")]


class MemoriesAdded(StrictModel):
    namespace: str
    ids: list[int]


class MemoryPage(StrictModel):
    namespace: str
    items: list[MemoryOut]
    limit: int
    offset: int
    #: The offset of the next page, or None on the last one.
    next_offset: int | None
