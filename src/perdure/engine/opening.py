"""Before an agent runs: open the sealed values of its memory, or say why it cannot.

A node opens an object's memory (its intent's arguments, step results, events, notes,
children's results) with the object's data key, so that replay hands the agent's code
the values, ``perdure.Secret`` objects included, as the first run saw them. An object
with nothing sealed, of an agent that does not encrypt all, costs a byte search per
record and no store read.

A node that cannot have the data key (it holds no key-encryption key that wrapped
it) runs nothing: it lets the object go, ready for another node, with a note naming
the key it needs, and logs the same line (``no_data_key``). Nothing is written to
memory, so nothing is lost: a node with the key runs it as if this one never looked.
A wrapped key or a sealed value that does not decrypt (damaged or forged bytes)
parks the object with the reason, as any failed integrity check does.
"""

from __future__ import annotations

import dataclasses
import logging

from perdure.core.bodies import Parked
from perdure.core.cycle import MemoryFacts
from perdure.core.lifecycle import Status
from perdure.core.records import Record
from perdure.core.sealing import marked
from perdure.engine.ending import park
from perdure.engine.journal import Journal
from perdure.engine.node import Node
from perdure.engine.settings import AgentDef
from perdure.errors import DataKeyError, SealBrokenError
from perdure.keys.sealer import Sealer, no_key_note
from perdure.stores.base import Claim, Event

__all__ = ["opened_memory"]

log = logging.getLogger("perdure.worker")


async def opened_memory(node: Node, claim: Claim, journal: Journal, records: list[Record],
                        facts: MemoryFacts, events: list[Event], agent: AgentDef
                        ) -> tuple[Sealer, list[Record], MemoryFacts] | None:
    """The run's sealer, and memory and facts with sealed values opened; ``None`` when
    the node let the object go or parked it (see the module)."""
    sealer = node.sealer(claim.object_id, seal_all=agent.encrypt)
    journal.secrets = sealer.secrets  # one set: what the run meets, the journal redacts
    sealed = (node.sealed_scan.sealed(claim.object_id, records)
              or any(marked(ev.payload) for ev in events))
    if not sealed and not agent.encrypt:
        return sealer, records, facts
    try:
        # Made on first need (a write) for an agent that encrypts all, and nothing is
        # sealed yet; with sealed values, a missing key is missing (never made anew).
        create = agent.encrypt and not sealed
        await (node.write if create else node.read)(lambda: sealer.data_key(create=create))
        if not sealed:
            return sealer, records, facts
        opened: list[Record] = await node.read(sealer.open_records, records)
        intent = facts.intent
        intent = dataclasses.replace(intent, args=tuple(sealer.open(list(intent.args))),
                                     kwargs=sealer.open(intent.kwargs),
                                     goal=sealer.open(intent.goal))
    except DataKeyError as exc:
        note = no_key_note(exc, node.signer.node_id)
        log.warning("%s: %s; leaving it", claim.object_id, note,
                    extra={"action": "no_data_key"})
        await node.release(claim, ready_at=node.clock() + node.settings.unknown_agent_retry,
                           status=Status.READY, note=note)
        return None
    except SealBrokenError as exc:
        await park(journal, exc, Parked(str(exc), "sealed_value_broken",
                                        claim.crashes).draft())
        return None
    return sealer, opened, dataclasses.replace(facts, intent=intent)
