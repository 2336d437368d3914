"""What a run knows of its object's model calls: the values memory holds (each message,
tool spec, reply message and call constants once, by number: ``perdure.llm``'s
``CallTable``), the ledger's charges and the summary in force per conversation. Built
from memory at the run's first model call, then kept up to date as calls are recorded."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from perdure.engine.commands.model_budget import call_key, charge_of_call, charges_of
from perdure.engine.signals import Park
from perdure.errors import RecordDecodeError
from perdure.llm import CallTable, Charge, ModelReply, StoredCallError, Summary

if TYPE_CHECKING:
    from perdure.engine.run import Run

__all__ = ["ModelMemory", "sealed_call", "sealed_chunks"]


class ModelMemory:
    """An object's model values (``table``) and its ledger's charges (``model_budget``)."""

    __slots__ = ("charges", "summaries", "table")

    def __init__(self) -> None:
        self.charges: dict[str, Charge] = {}
        self.table = CallTable()
        # the summary in force per conversation (``model_context``), rebuilt by replay
        self.summaries: dict[str, Summary] = {}

    @classmethod
    def of(cls, run: Run) -> ModelMemory:
        """The run's model memory (built from its records the first time)."""
        memory = run._models
        if memory is None:
            memory = run._models = cls()
            records = [rec for recs in run._history.values() for rec in recs]
            memory.charges.update(charges_of(records))
            try:
                memory.table = CallTable.of(records)
            except StoredCallError as exc:  # signed, yet it does not read: a person looks
                run._models = None
                raise Park(RecordDecodeError(run.object_id, exc.seq, exc.reason)) from None
        return memory

    def learn(self, body: Mapping[str, Any]) -> None:
        """Take in a ``model_call`` body just recorded: its charge (its values were
        numbered when it was encoded)."""
        self.charges[call_key(body)] = charge_of_call(body)

    def reply_of(self, body: Mapping[str, Any], *, object_id: str = "?",
                 seq: int = 0) -> ModelReply:
        """The reply a ``model_call`` body (record ``seq`` of ``object_id``) holds, as
        the agent gets it; one that does not read back parks the object
        (``RecordDecodeError``)."""
        try:
            return self.table.reply_of(body)
        except ValueError as exc:
            raise Park(RecordDecodeError(object_id, seq, str(exc))) from None


def _seals_all(run: Run) -> bool:
    return run._sealer is not None and run._sealer.seal_all


def sealed_call(run: Run, name: str, request: dict[str, Any], blobs: dict[str, Any],
                recovery: dict[str, Any] | None
                ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any] | None]:
    """A call's ``request``, new ``blobs`` and ``recovery`` as memory keeps them: for an
    agent that encrypts all, each value (message, tool spec, reply message, constants), a
    given prefix and a salvaged text sealed under the object's data key, still stored
    once per object under its number; as they are otherwise. Replay gets them opened
    (the run's records are), so the call table numbers the same values."""
    if not _seals_all(run):
        return request, blobs, recovery
    what = f"a value of model call {name!r}"
    blobs = {number: run._stored(value, what=what)[0] for number, value in blobs.items()}
    if isinstance(request.get("prefix"), str):
        request = {**request, "prefix": run._stored(request["prefix"], what=what)[0]}
    if recovery is not None and isinstance(recovery.get("partial"), str):
        recovery = {**recovery, "partial": run._stored(recovery["partial"], what=what)[0]}
    return request, blobs, recovery


def sealed_chunks(run: Run, name: str, chunks: Sequence[dict[str, Any]]
                  ) -> tuple[dict[str, Any], ...]:
    """A batch of a streamed reply as memory keeps it: each chunk sealed for an agent
    that encrypts all (its text is the reply's), as it is otherwise."""
    if not _seals_all(run):
        return tuple(chunks)
    what = f"a chunk of model call {name!r}"
    return tuple(run._stored(chunk, what=what)[0] for chunk in chunks)
