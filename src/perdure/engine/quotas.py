"""A node's side of model quotas (``perdure.core.quotas``): it declares its App's quotas
in the store as it starts, and hands its runs a ``QuotaGate`` through which ``run.model``
reserves before a call, settles after it and reports 429s. The store decides every
reservation, so every node applies the same quotas, whichever declared them.

The gate knows which provider and model have a quota from the store (looked at again
every ``LOOK`` seconds), so a call of a model without one costs no round trip.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from perdure.core.quotas import ModelQuota
from perdure.errors import StoreError
from perdure.stores.base import QuotaGrant

if TYPE_CHECKING:
    from perdure.engine.node import Node

__all__ = ["LOOK", "QuotaGate", "declare_model_quotas", "quota_provider"]

log = logging.getLogger("perdure.worker")

LOOK = 1.0
"""Seconds between a node's looks at which quotas the store holds."""


def quota_provider(client_provider: str) -> str:
    """The quota provider of a client kind: its API family (``openai.chat`` and
    ``openai.responses`` are ``openai``; ``anthropic`` is ``anthropic``)."""
    return client_provider.partition(".")[0]


def declare_model_quotas(node: Node) -> None:
    """Keep the quotas this node's App declares in the store (on the write thread); a
    declaration that changes a quota's limits is logged, with both."""
    for quota in node.settings.model_quotas:
        before = node.store.declare_model_quota(quota, node.clock())
        if before is not None:
            log.warning("model quota %s/%s: limits changed from %s to %s (this node's "
                        "declaration); every node now reserves by the new ones",
                        quota.provider, quota.model, before.limits(), quota.limits(),
                        extra={"action": "quota_limits_changed", "provider": quota.provider,
                               "model": quota.model})
    node.quotas.known = {q.key for q in node.settings.model_quotas} | node.quotas.known


class QuotaGate:
    """What ``run.model`` asks of the store about quotas, off the event loop."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.known: set[tuple[str, str]] = set()  # quotas the store holds
        self.looked = float("-inf")

    async def applies(self, provider: str, model: str) -> bool:
        """Whether the store holds a quota of ``provider``'s ``model``."""
        now = time.monotonic()
        if now - self.looked >= LOOK:
            self.looked = now
            try:
                found: list[ModelQuota] = await self.node.read(self.node.store.model_quotas)
            except StoreError:
                found = []  # the reservation itself will tell if the store is down
            self.known = {q.key for q in found} | {
                q.key for q in self.node.settings.model_quotas}
        return (provider, model) in self.known

    async def reserve(self, provider: str, model: str, tokens: int, object_id: str,
                      holder: str) -> QuotaGrant:
        """Reserve ``tokens`` and a request (the store decides; see ``ModelQuotas``)."""
        store, now = self.node.store, self.node.clock()
        grant: QuotaGrant = await self.node.write(store.reserve_quota, provider, model,
                                                  tokens, object_id, holder, now)
        return grant

    async def settle(self, ticket: int, tokens: int) -> None:
        """Settle ``ticket`` to what the provider reported."""
        await self.node.write(self.node.store.settle_quota, ticket, tokens, self.node.clock())

    async def throttled(self, provider: str, model: str, retry_after: float | None) -> None:
        """The provider answered 429: adapt the quota, and say so in the log."""
        state = await self.node.write(self.node.store.quota_throttled, provider, model,
                                      retry_after, self.node.clock())
        if state is not None:
            log.warning("model quota %s/%s: the provider answered 429; rate lowered to "
                        "%.0f%% of the declared one (no call before %s s)", provider, model,
                        100 * state.factor, retry_after,
                        extra={"action": "quota_throttled", "provider": provider,
                               "model": model, "factor": state.factor})
