"""HTTP webhooks: a signed ``POST`` starts or signals one object.

Declared with ``Triggers.of(app).webhook(name, agent=..., secret=...)`` and served by
the HTTP API at ``/api/v1/hooks/<name>`` (``perdure api`` and ``perdure ui``): there is
nothing to consume, the server calls ``WebhookTrigger.verify`` and then ``deliver``
with each request. No package beyond the standard library.

The signature scheme is that of Standard Webhooks (the one Svix sends) and close to
Stripe's: three headers,

- ``Webhook-Timestamp``: the time of sending, whole seconds since the epoch;
- ``Webhook-Signature``: ``v1,`` and the base64 HMAC-SHA256 of the signed content, under
  the secret; several signatures separated by spaces (a sender rotating its secret);
- ``Webhook-Id`` (optional): the delivery's id, the same when the sender delivers again;

where the signed content is ``<id>.<timestamp>.<body>`` when the id is sent and
``<timestamp>.<body>`` when it is not (``sig-`` and the signature's hex then stand for
the id). A secret
beginning with ``whsec_`` is the base64 of the key (as Standard Webhooks gives them);
any other is its UTF-8 bytes. A request whose timestamp is older than ``tolerance``
seconds, or more than ``skew`` seconds ahead, is refused, so a captured request cannot
be played again later; signatures are compared in constant time.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from perdure.core.secret import Secret
from perdure.errors import ConfigurationError, WebhookRefusedError
from perdure.triggers.common import AfterCommit, Trigger

if TYPE_CHECKING:
    from perdure.app import App

__all__ = ["ID_HEADER", "SIGNATURE_HEADER", "TIMESTAMP_HEADER", "WebhookTrigger", "sign"]

ID_HEADER = "webhook-id"
TIMESTAMP_HEADER = "webhook-timestamp"
SIGNATURE_HEADER = "webhook-signature"
_ID_MAX = 256
_TIMESTAMP = re.compile(r"[0-9]{1,12}")


def _key(secret: str) -> bytes:
    if secret.startswith("whsec_"):
        try:
            return base64.b64decode(secret.removeprefix("whsec_"), validate=True)
        except (binascii.Error, ValueError):
            raise ConfigurationError("a webhook secret beginning with whsec_ is the base64 of "
                                     "the key; this one is not base64") from None
    return secret.encode("utf-8")


def _content(delivery_id: str | None, timestamp: str, body: bytes) -> bytes:
    prefix = f"{delivery_id}.{timestamp}." if delivery_id is not None else f"{timestamp}."
    return prefix.encode("utf-8") + body


def sign(secret: str | Secret[str], body: bytes, timestamp: int | str,
         delivery_id: str | None = None) -> dict[str, str]:
    """The headers a sender puts on ``body`` (what a test or a Python sender uses):
    ``Webhook-Timestamp``, ``Webhook-Signature`` and, when ``delivery_id`` is given,
    ``Webhook-Id``."""
    raw = secret.reveal() if isinstance(secret, Secret) else secret
    digest = hmac.new(_key(raw), _content(delivery_id, str(timestamp), body),
                      hashlib.sha256).digest()
    headers = {"Webhook-Timestamp": str(timestamp),
               "Webhook-Signature": "v1," + base64.b64encode(digest).decode("ascii")}
    if delivery_id is not None:
        headers["Webhook-Id"] = delivery_id
    return headers


@dataclass(frozen=True, kw_only=True)
class WebhookTrigger(Trigger):
    """A webhook (``Triggers.webhook`` declares one): requests to
    ``/api/v1/hooks/<name>`` signed with ``secret`` (a ``Secret`` holding the text) or
    with the secret in environment variable ``secret_env`` (read at each request, so
    the serving process needs it, and a rotated value takes effect at once).

    ``tolerance`` is how old a request's timestamp may be (seconds, 300 by default),
    ``skew`` how far ahead of this server's clock (30); ``max_body`` the largest body
    taken (bytes, 1 MiB). The delivery id (``Webhook-Id``, else the signature) names
    what the request does, as a message id does for the other triggers.
    """

    secret: Secret[str] | None = None
    secret_env: str | None = None
    tolerance: float = 300.0
    skew: float = 30.0
    max_body: int = 1024 * 1024

    kind: ClassVar[str] = "webhook"

    def __post_init__(self) -> None:
        super().__post_init__()
        if (self.secret is None) == (self.secret_env is None):
            raise ConfigurationError(f"webhook {self.name!r}: give exactly one of "
                                     "secret=perdure.Secret('...') or secret_env='VARIABLE'")
        if self.secret is not None:
            if not isinstance(self.secret, Secret) or not isinstance(self.secret.reveal(), str):
                raise ConfigurationError(f"webhook {self.name!r}: secret is a perdure.Secret "
                                         "holding text (secret_env= names a variable)")
            if len(self.secret.reveal()) < 16:
                raise ConfigurationError(f"webhook {self.name!r}: the secret is shorter than "
                                         "16 characters; use a long random one (openssl rand "
                                         "-hex 32)")
            _key(self.secret.reveal())
        elif not isinstance(self.secret_env, str) or not self.secret_env:
            raise ConfigurationError(f"webhook {self.name!r}: secret_env names an environment "
                                     "variable")
        for what, value in (("tolerance", self.tolerance), ("skew", self.skew)):
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ConfigurationError(f"webhook {self.name!r}: {what} is a number of "
                                         f"seconds, not {value!r}")
        if self.tolerance <= 0:
            raise ConfigurationError(f"webhook {self.name!r}: tolerance must be more than 0")
        if isinstance(self.max_body, bool) or not isinstance(self.max_body, int) or (
                self.max_body < 1):
            raise ConfigurationError(f"webhook {self.name!r}: max_body is a number of bytes, "
                                     f"not {self.max_body!r}")

    def source(self) -> str:
        """The route it is served at."""
        return f"POST /api/v1/hooks/{self.name}"

    async def consume(self, app: App, stop: asyncio.Event, *,
                      after_commit: AfterCommit | None = None,
                      drain_seconds: float = 10.0) -> None:
        """Nothing to consume: the HTTP server (``perdure api``, ``perdure ui``) serves
        a webhook. Waits for ``stop``."""
        await stop.wait()

    def _secret(self) -> str:
        if self.secret is not None:
            return self.secret.reveal()
        assert self.secret_env is not None
        value = os.environ.get(self.secret_env)
        if not value:
            raise ConfigurationError(f"webhook {self.name!r}: the environment variable "
                                     f"{self.secret_env} holding its secret is not set in "
                                     "this server's process")
        return value

    def verify(self, headers: Mapping[str, str], body: bytes, now: float) -> str:
        """The delivery id of a request (its ``Webhook-Id``, else ``sig-`` and the hex
        of its signature) if its headers sign ``body`` within the replay window at time ``now``;
        else ``WebhookRefusedError`` saying why (nothing to apply). ``headers`` keys are
        lower case. ``ConfigurationError`` when this server lacks the secret."""
        stamp = headers.get(TIMESTAMP_HEADER)
        given = headers.get(SIGNATURE_HEADER)
        if stamp is None or given is None:
            missing = TIMESTAMP_HEADER if stamp is None else SIGNATURE_HEADER
            raise WebhookRefusedError(401, "bad-signature",
                                      f"the request is not signed: no {missing.title()} header "
                                      "(see docs/howto/triggers.md#webhooks)")
        stamp = stamp.strip()
        if not _TIMESTAMP.fullmatch(stamp):
            raise WebhookRefusedError(400, "malformed", "Webhook-Timestamp must be whole "
                                                        "seconds since the epoch")
        delivery = headers.get(ID_HEADER)
        if delivery is not None:
            delivery = delivery.strip()
            if not delivery or len(delivery) > _ID_MAX or not delivery.isprintable():
                raise WebhookRefusedError(400, "malformed", f"Webhook-Id must be 1 to "
                                                            f"{_ID_MAX} printable characters")
        expected = hmac.new(_key(self._secret()), _content(delivery, stamp, body),
                            hashlib.sha256).digest()
        matched = False
        for part in given.split():
            version, _, value = part.partition(",")
            if version != "v1":
                continue
            try:
                presented = base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError):
                continue
            matched = hmac.compare_digest(presented, expected) or matched
        if not matched:
            raise WebhookRefusedError(401, "bad-signature",
                                      "the signature does not match the body and timestamp "
                                      "under this webhook's secret")
        age = now - int(stamp)
        if age > self.tolerance:
            raise WebhookRefusedError(401, "stale-timestamp",
                                      f"the request was signed {age:.0f} s ago, more than the "
                                      f"{self.tolerance:g} s this webhook accepts")
        if -age > self.skew:
            raise WebhookRefusedError(401, "future-timestamp",
                                      f"the request's timestamp is {-age:.0f} s ahead of this "
                                      f"server's clock (at most {self.skew:g} s allowed)")
        return delivery if delivery is not None else "sig-" + expected.hex()

    def describe(self) -> dict[str, object]:
        """The declaration as JSON values (the secret is never shown)."""
        doc = dict(super().describe())
        doc["secret"] = (f"env {self.secret_env}" if self.secret_env is not None
                         else "Secret('***')")
        return doc
