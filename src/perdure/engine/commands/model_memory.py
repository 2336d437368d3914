"""What a run knows of its object's model calls: the values memory holds (each message,
tool spec, reply message and call constants once, by number: ``perdure.llm``'s
``CallTable``), the ledger's charges and the summary in force per conversation. Built
from memory at the run's first model call, then kept up to date as calls are recorded."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from perdure.engine.commands.model_budget import call_key, charge_of_call, charges_of
from perdure.engine.signals import Park
from perdure.errors import RecordDecodeError
from perdure.llm import CallTable, Charge, ModelReply, StoredCallError, Summary

if TYPE_CHECKING:
    from perdure.engine.run import Run

__all__ = ["ModelMemory"]


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
