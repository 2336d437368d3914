"""Triggers: objects started or signalled from outside, by message brokers and watched
folders (``docs/howto/triggers.md``).

::

    from perdure.triggers import Triggers

    triggers = Triggers.of(app)
    triggers.rabbitmq("jobs", agent=review)                       # one object per message
    triggers.nats("orders.paid", stream="ORDERS", agent=order, mode="signal",
                  event="paid", object_field="order_id")         # an event to an object
    triggers.folder("inbox", agent=ingest)                         # one object per file
    triggers.webhook("reviews", agent=review, secret_env="HOOK_SECRET")  # signed POSTs

then ``perdure --app mymodule:app triggers run`` (or ``perdure worker --triggers``);
webhooks are served by the HTTP API instead (``perdure api``, ``perdure ui``), at
``/api/v1/hooks/<name>``.

A message's id names what it does (the object it starts, the dedupe key of the event it
sends) and it is acknowledged only after that is committed, so a message delivered
again changes nothing. One that can never apply goes to a dead letter, with the reason.
RabbitMQ needs ``perdure[rabbitmq]``, NATS ``perdure[nats]``; the folder watcher needs
nothing more. Triggers are an edge: they start and signal objects through the App's
public API (``app.aio``), as any program would.
"""

from __future__ import annotations

from perdure.triggers.common import Message, Mode, Outcome, Result, Trigger, deliver
from perdure.triggers.folder import FolderTrigger
from perdure.triggers.nats import NatsTrigger
from perdure.triggers.rabbitmq import RabbitMQTrigger
from perdure.triggers.registry import DRAIN_SECONDS, Triggers
from perdure.triggers.webhook import WebhookTrigger, sign

__all__ = [
    "DRAIN_SECONDS",
    "FolderTrigger",
    "Message",
    "Mode",
    "NatsTrigger",
    "Outcome",
    "RabbitMQTrigger",
    "Result",
    "Trigger",
    "Triggers",
    "WebhookTrigger",
    "deliver",
    "sign",
]
