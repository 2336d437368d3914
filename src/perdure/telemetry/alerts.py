"""Alerts and notifications evaluated by the nodes themselves, with no central process.

An App declares rules (``Alerts(app, rules=[...], webhook=..., secret=...)``); every
worker that runs them (``perdure worker`` does whenever the App declares some, a program
of its own passes ``alerts.run`` to ``App.run_worker(also=[...])``) evaluates them every
``every`` seconds against the shared store. Each rule names the subjects it finds wrong
(an object, the nodes, the failure rate); a subject becomes an alert through the store's
``AlertRows`` role, whose writes are conditional: of all the nodes seeing the same
subject, exactly one fires it and later exactly one resolves it, and only that node
delivers: a ``WARNING`` log line (``action`` ``alert_firing`` / ``alert_resolved`` /
``notification``) and, with a ``webhook``, a ``POST`` of one JSON object signed as
Standard Webhooks sign (``Webhook-Id``, ``Webhook-Timestamp``, ``Webhook-Signature``:
see ``perdure.triggers.webhook.sign``), retried with backoff. A failed delivery is
logged and never stops the worker; the alert stays recorded in the store either way
(the dashboard's Alerts page lists it).

Notifications for people are rules too: ``NewApproval`` and ``NewQuestion`` notify once
per waiting tool call or question (with a link to the dashboard's inbox when
``base_url`` is given) and, with ``remind_after``, once more as a reminder if it is
still waiting that long after it was asked.

A node that wins a write and dies before delivering loses that delivery (the store
still shows the alert): delivery is at most once, deduplication exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import logging
import urllib.error
import urllib.request
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import quote

from perdure.core.secret import Secret
from perdure.errors import ConfigurationError
from perdure.stores.base import ObjectFilter
from perdure.triggers.webhook import sign

if TYPE_CHECKING:
    from perdure.app import App
    from perdure.stores import Store
    from perdure.stores.base import AlertRow

__all__ = [
    "NOTIFY",
    "Alert",
    "Alerts",
    "ApprovalWaiting",
    "FailureRate",
    "FewWorkers",
    "NewApproval",
    "NewQuestion",
    "NoProgress",
    "Parked",
    "Rule",
]

log = logging.getLogger("perdure.alerts")

#: The prefix of notification rules' names (they are not alerts: nothing resolves them
#: for people, and the dashboard lists them apart).
NOTIFY = "notify."


@dataclass(frozen=True, slots=True)
class Alert:
    """What is delivered: ``kind`` is ``firing``, ``resolved`` or ``notification``;
    ``rule`` and ``subject`` name it, ``summary`` says it; ``fired_at`` (and
    ``resolved_at``) when; ``node_id`` the node that delivered it; ``link`` a dashboard
    address (``None`` without ``base_url``)."""

    kind: str
    rule: str
    subject: str
    summary: str
    fired_at: float
    node_id: str
    resolved_at: float | None = None
    link: str | None = None

    @property
    def delivery_id(self) -> str:
        """The same for every attempt at delivering it (``Webhook-Id``)."""
        raw = f"{self.kind}\0{self.rule}\0{self.subject}\0{self.fired_at!r}"
        return "alert_" + hashlib.sha256(raw.encode()).hexdigest()[:32]

    def to_json(self) -> dict[str, Any]:
        """The JSON object a webhook receives."""
        return {"type": f"alert.{self.kind}" if self.kind != "notification"
                else "notification", "rule": self.rule, "subject": self.subject,
                "summary": self.summary, "fired_at": self.fired_at,
                "resolved_at": self.resolved_at, "node_id": self.node_id,
                "link": self.link}


@dataclass(frozen=True, slots=True)
class _Look:
    """What one evaluation pass reads, once, for every rule."""

    app: App
    store: Store
    now: float


class Rule:
    """A condition the nodes watch: ``name`` (unique among an App's rules) and
    ``check``, which says which subjects are wrong now, each with a summary."""

    name: str

    def check(self, look: _Look) -> dict[str, str]:
        """``{subject: summary}`` of what is wrong at ``look.now`` (blocking reads)."""
        raise NotImplementedError


def _positive(rule: str, what: str, value: float) -> None:
    if not isinstance(value, (int, float)) or value <= 0:
        raise ConfigurationError(f"alert rule {rule}: {what} must be a positive number, "
                                 f"not {value!r}")


@dataclass(frozen=True)
class NoProgress(Rule):
    """An object runnable or running (not parked, paused or waiting) whose memory got
    no new record for ``seconds``: stuck in a step, or with no worker to take it."""

    seconds: float
    agent: str | None = None
    name: str = "no_progress"
    limit: int = 1000

    def __post_init__(self) -> None:
        _positive(self.name, "seconds", self.seconds)

    def check(self, look: _Look) -> dict[str, str]:
        """Objects ``running`` or ``ready`` last updated ``seconds`` ago or more."""
        found = {}
        for status in ("running", "ready"):
            for row in look.store.browse(ObjectFilter(status=status, agent=self.agent),
                                         limit=self.limit, now=look.now):
                idle = look.now - row.updated_at
                if idle >= self.seconds:
                    found[row.object_id] = (f"{row.agent} object {row.object_id} {status}, "
                                            f"no new record for {idle:.0f} s")
        return found


@dataclass(frozen=True)
class Parked(Rule):
    """An object parked: it cannot go on without a person (``perdure retry``)."""

    agent: str | None = None
    name: str = "parked"
    limit: int = 1000

    def check(self, look: _Look) -> dict[str, str]:
        """Every parked object (of ``agent``, if given)."""
        return {row.object_id: f"{row.agent} object {row.object_id} parked: {row.note or ''}"
                for row in look.store.browse(ObjectFilter(status="parked", agent=self.agent),
                                             limit=self.limit, now=look.now)}


@dataclass(frozen=True)
class FailureRate(Rule):
    """Of the objects that ended within the last ``window`` seconds (at least
    ``minimum`` of them), the share that failed reached ``threshold`` (0 to 1)."""

    threshold: float
    window: float = 300.0
    minimum: int = 5
    name: str = "failure_rate"

    def __post_init__(self) -> None:
        if not 0 < self.threshold <= 1:
            raise ConfigurationError(f"alert rule {self.name}: threshold is a share, "
                                     f"above 0 and at most 1, not {self.threshold!r}")
        _positive(self.name, "window", self.window)

    def check(self, look: _Look) -> dict[str, str]:
        """One subject, ``objects``, while the rate is at or over the threshold."""
        ended = look.store.ended_since(look.now - self.window)
        failed = sum(1 for status, _ in ended if status == "failed")
        if len(ended) < self.minimum or failed < self.threshold * len(ended):
            return {}
        return {"objects": f"{failed} of {len(ended)} objects ended in the last "
                           f"{self.window:.0f} s failed"}


@dataclass(frozen=True)
class FewWorkers(Rule):
    """Fewer than ``minimum`` live nodes (by their heartbeats)."""

    minimum: int
    name: str = "few_workers"

    def __post_init__(self) -> None:
        _positive(self.name, "minimum", self.minimum)

    def check(self, look: _Look) -> dict[str, str]:
        """One subject, ``nodes``, while too few are live."""
        live = look.store.live_nodes(look.now)
        if len(live) >= self.minimum:
            return {}
        return {"nodes": f"{len(live)} live node(s), fewer than {self.minimum}"}


@dataclass(frozen=True)
class ApprovalWaiting(Rule):
    """A tool call waiting for a person's approval for ``seconds`` or more."""

    seconds: float
    name: str = "approval_waiting"

    def __post_init__(self) -> None:
        _positive(self.name, "seconds", self.seconds)

    def check(self, look: _Look) -> dict[str, str]:
        """Each approval asked ``seconds`` ago or more."""
        return {f"{p.object_id}/{p.proposal_id}":
                f"{p.tool} of {p.object_id} waits for approval for "
                f"{look.now - p.requested_at:.0f} s"
                for p in look.app.approvals() if look.now - p.requested_at >= self.seconds}


@dataclass(frozen=True)
class NewApproval(Rule):
    """Tell people of each tool call waiting for approval, once; with ``remind_after``,
    once more if it still waits that many seconds after it was asked."""

    remind_after: float | None = None
    name: str = NOTIFY + "approval"

    def check(self, look: _Look) -> dict[str, str]:
        """Each waiting approval."""
        return {f"{p.object_id}/{p.proposal_id}": f"{p.tool} of {p.object_id} waits for "
                "approval" for p in look.app.approvals()
                if _due(self.remind_after, look.now, p.requested_at)}


@dataclass(frozen=True)
class NewQuestion(Rule):
    """Tell people of each question a waiting object asks, once; with ``remind_after``,
    once more if it is still unanswered that many seconds after it was asked."""

    remind_after: float | None = None
    name: str = NOTIFY + "question"

    def check(self, look: _Look) -> dict[str, str]:
        """Each open question."""
        return {f"{q.object_id}/{q.seq}":
                f"{q.agent} object {q.object_id} asks: {_asked(q.prompt, q.choices)}"
                for q in look.app.questions(limit=1000)
                if _due(self.remind_after, look.now, q.asked_at)}


# A notification rule's check runs twice a pass: for the notice (remind_after is None
# then) and for the reminder (its own rule, ``<name>.reminder``).
def _due(remind_after: float | None, now: float, since: float) -> bool:
    return remind_after is None or now - since >= remind_after


def _asked(prompt: Any, choices: Sequence[Any] | None) -> str:
    text = prompt if isinstance(prompt, str) else json.dumps(prompt, default=str)
    if choices:
        text += f" (choices: {', '.join(str(c) for c in choices)})"
    return text[:500]


def _reminder(rule: Rule) -> Rule | None:
    remind = getattr(rule, "remind_after", None)
    if remind is None:
        return None
    _positive(rule.name, "remind_after", remind)
    return type(rule)(remind_after=remind, name=rule.name + ".reminder")  # type: ignore[call-arg]


def _notice(rule: Rule) -> Rule:
    return (type(rule)(remind_after=None, name=rule.name)  # type: ignore[call-arg]
            if getattr(rule, "remind_after", None) is not None else rule)


@dataclass
class Alerts:
    """An App's alert and notification rules, and where they are delivered.

    ``webhook``: the URL each alert is ``POST``ed to (``None``: the log only), signed
    with ``secret`` (a ``perdure.Secret`` holding text of 16 characters or more, or a
    ``whsec_`` key); ``base_url``: the dashboard's address, for links; ``every``: seconds
    between evaluations on each node; ``attempts`` and ``backoff``: a delivery is tried
    that many times, waiting ``backoff``, then twice that, ... between tries; ``timeout``:
    seconds per attempt.

    Declaring registers the rules with ``app`` (``Alerts.of(app)``), so that
    ``perdure worker`` runs them; a program of its own passes ``alerts.run`` to
    ``App.run_worker(also=[...])``.
    """

    app: App
    rules: Sequence[Rule]
    webhook: str | None = None
    secret: Secret[str] | None = None
    base_url: str | None = None
    every: float = 30.0
    attempts: int = 4
    backoff: float = 0.5
    timeout: float = 5.0
    _rules: tuple[Rule, ...] = field(init=False, repr=False)

    _of: ClassVar[weakref.WeakKeyDictionary[Any, Alerts]] = weakref.WeakKeyDictionary()

    def __post_init__(self) -> None:
        expanded: list[Rule] = []
        for rule in self.rules:
            if not isinstance(rule, Rule):
                raise ConfigurationError(f"alert rules are perdure.telemetry.alerts rules "
                                         f"(NoProgress, Parked, ...), not {rule!r}")
            expanded.append(_notice(rule))
            reminder = _reminder(rule)
            if reminder is not None:
                expanded.append(reminder)
        names = [rule.name for rule in expanded]
        if len(set(names)) != len(names):
            raise ConfigurationError(f"alert rules need distinct names: {names}")
        self._rules = tuple(expanded)
        _positive("alerts", "every", self.every)
        _positive("alerts", "timeout", self.timeout)
        if not isinstance(self.attempts, int) or self.attempts < 1:
            raise ConfigurationError("alerts: attempts is a whole number, 1 or more")
        if self.webhook is not None:
            if not self.webhook.startswith(("http://", "https://")):
                raise ConfigurationError(f"alerts: webhook is an http(s) URL, not "
                                         f"{self.webhook!r}")
            if not isinstance(self.secret, Secret) or not isinstance(self.secret.reveal(), str):
                raise ConfigurationError("alerts: a webhook needs secret=perdure.Secret('...')")
            if len(self.secret.reveal()) < 16:
                raise ConfigurationError("alerts: the secret is shorter than 16 characters; "
                                         "use a long random one (openssl rand -hex 32)")
            sign(self.secret, b"", 0)  # a bad whsec_ key fails here, not at delivery
        self._register(self.app, self)

    @classmethod
    def _register(cls, app: App, alerts: Alerts) -> None:
        cls._of[app] = alerts

    @classmethod
    def of(cls, app: App) -> Alerts | None:
        """The alerts ``app`` declared, if any."""
        return cls._of.get(app)

    def bound(self, app: App) -> Alerts:
        """The same rules and delivery, evaluated by ``app`` (its store, node and clock):
        what ``perdure worker`` runs when ``--store`` or ``--node-id`` give it an App of
        its own."""
        if app is self.app:
            return self
        return dataclasses.replace(self, app=app)

    @property
    def names(self) -> tuple[str, ...]:
        """The names of the rules evaluated (a reminder is a rule of its own)."""
        return tuple(rule.name for rule in self._rules)

    # -- evaluating ----------------------------------------------------------------

    def evaluate(self) -> list[Alert]:
        """One pass on this node (blocking: run it on a thread): check every rule, fire
        what is newly wrong and resolve what is right again, through the store's
        conditional writes; the alerts this node won (to deliver). A rule that fails is
        logged and skipped."""
        store = self.app.store
        look = _Look(self.app, store, self.app.clock())
        node = self.app.node_id
        won: list[Alert] = []
        firing: dict[str, set[str]] = {}
        for row in store.alerts(state="firing", limit=100_000):
            firing.setdefault(row.rule, set()).add(row.subject)
        for rule in self._rules:
            try:
                wrong = rule.check(look)
            except Exception as exc:  # noqa: BLE001 - a rule's failure never stops the others
                log.warning("alert rule %s could not be evaluated: %s", rule.name, exc,
                            extra={"action": "alert_rule_failed"})
                continue
            notify = rule.name.startswith(NOTIFY)
            for subject, summary in wrong.items():
                if subject in firing.get(rule.name, ()):
                    continue
                if store.fire_alert(rule.name, subject, summary, node, look.now):
                    won.append(Alert("notification" if notify else "firing", rule.name,
                                     subject, summary, look.now, node,
                                     link=self._link(subject, notify)))
            for subject in firing.get(rule.name, set()) - set(wrong):
                ended = store.resolve_alert(rule.name, subject, look.now)
                if ended is not None and not notify:
                    won.append(self._resolved(ended, look.now))
        return won

    def _resolved(self, row: AlertRow, now: float) -> Alert:
        return Alert("resolved", row.rule, row.subject, row.summary, row.fired_at,
                     self.app.node_id, resolved_at=now, link=self._link(row.subject, False))

    def _link(self, subject: str, notify: bool) -> str | None:
        if self.base_url is None:
            return None
        base = self.base_url.rstrip("/")
        if notify:
            return f"{base}/inbox#{quote(subject.split('/')[0], safe='')}"
        return f"{base}/alerts"

    # -- delivering ----------------------------------------------------------------

    def _post(self, alert: Alert) -> None:
        """One attempt; raises on failure."""
        assert self.webhook is not None and self.secret is not None
        body = json.dumps(alert.to_json(), separators=(",", ":")).encode()
        headers = sign(self.secret, body, int(self.app.clock()), alert.delivery_id)
        headers["Content-Type"] = "application/json"
        request = urllib.request.Request(  # noqa: S310 - the scheme was checked: http(s)
            self.webhook, data=body, headers=headers, method="POST")
        with urllib.request.urlopen(request, timeout=self.timeout) as reply:  # noqa: S310
            reply.read()

    async def deliver(self, alerts: Iterable[Alert]) -> None:
        """Log each alert, and post it to the webhook (retried with backoff; a failure
        is logged, never raised)."""
        for alert in alerts:
            level = logging.INFO if alert.kind == "resolved" else logging.WARNING
            log.log(level, "%s %s [%s]: %s", "notification" if alert.kind == "notification"
                    else f"alert {alert.kind}", alert.rule, alert.subject, alert.summary,
                    extra={"action": "notification" if alert.kind == "notification"
                           else f"alert_{alert.kind}", "rule": alert.rule,
                           "subject": alert.subject})
            if self.webhook is None:
                continue
            delay = self.backoff
            for attempt in range(1, self.attempts + 1):
                try:
                    await asyncio.to_thread(self._post, alert)
                    break
                except (OSError, urllib.error.URLError, ValueError) as exc:
                    if attempt == self.attempts:
                        log.warning("alert %s [%s] not delivered to the webhook after %d "
                                    "attempt(s): %s", alert.rule, alert.subject, attempt, exc,
                                    extra={"action": "alert_undelivered"})
                        break
                    await asyncio.sleep(delay)
                    delay *= 2

    async def run(self, stop: asyncio.Event) -> None:
        """Evaluate and deliver every ``every`` seconds until ``stop`` is set (what
        ``App.run_worker(also=[alerts.run])`` runs beside a worker). A store that cannot
        be reached is logged and tried again at the next pass."""
        while not stop.is_set():
            try:
                won = await asyncio.to_thread(self.evaluate)
            except Exception as exc:  # noqa: BLE001 - the store is down: try again next time
                log.warning("alerts not evaluated: %s", exc, extra={"action": "alerts_failed"})
                won = []
            await self.deliver(won)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.every)
