"""``run.model(stream=True)``: a streamed reply journaled as it arrives, and recovered
after a crash."""

from __future__ import annotations

from collections.abc import Sequence

from perdure.core.records import Kind, Record
from perdure.engine.commands.model_calls import Attempts
from perdure.llm import Salvage, StreamChunk

__all__ = ["StreamAttempts", "salvage_of"]

_MODEL_CHUNKS = Kind.MODEL_CHUNKS.value


def salvage_of(recs: Sequence[Record], attempt: int) -> Salvage | None:
    """What memory holds of attempt ``attempt``'s stream (``None``: nothing)."""
    chunks = [StreamChunk.from_json(c) for r in recs
              if r.kind == _MODEL_CHUNKS and r.body["attempt"] == attempt
              for c in r.body["chunks"]]
    return Salvage.from_chunks(chunks) if chunks else None


class StreamAttempts(Attempts):
    """A streaming call."""
