"""The rules of a schedule: its spec, its fire times, what a fire starts. Pure, no I/O.

A schedule is an object of its own (agent ``SCHEDULE_AGENT``, id ``schedule_id(name)``):
dormant until its next fire, it then starts at most one run per fire, as a child object
whose id is ``run_id(name, fire)``, so that however often the schedule is replayed or
re-executed after a crash a fire never starts two runs. Everything it decides comes
from three pure functions here, over values its memory records:

- ``plan(spec, state, now, finished, started)``: at ``now``, which fires are due (the
  scheduled ones since the last look, within the catch-up window, and those asked for
  by a trigger or a backfill), which runs they start or skip by the overlap policy,
  which runs to cancel, the new state and when to look again;
- ``apply_control(spec, state, payload)``: a pause, resume, trigger, backfill, update or
  delete sent to the schedule (a signed event its memory receives);
- ``read_schedule(records)``: what a schedule's memory says (``ScheduleInfo``), for
  listings.

Catch-up after downtime: by default (``catch_up_window=None``) only the most recent
missed fire runs, however many were missed; with a window, every fire missed by less
than it runs (oldest first, at most ``MAX_FIRES``) and older ones are dropped. Fires
missed while the schedule was paused are dropped: resuming never catches up.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from perdure.core.cron import Cron
from perdure.core.events import SCHEDULE_EVENT
from perdure.core.names import check_name, check_object_id
from perdure.core.records import Kind, Record
from perdure.errors import ScheduleError

__all__ = [
    "MAX_FIRES",
    "NAME_MAX",
    "OVERLAPS",
    "PLAN_STEP",
    "SCHEDULE_AGENT",
    "SCHEDULE_PREFIX",
    "Plan",
    "ScheduleInfo",
    "ScheduleSpec",
    "ScheduleState",
    "apply_control",
    "control_payload",
    "jitter_of",
    "plan",
    "read_schedule",
    "run_id",
    "schedule_id",
]

#: The agent every schedule object runs (registered by every ``App``).
SCHEDULE_AGENT = "perdure.schedule"
#: A schedule named ``n`` is object ``SCHEDULE_PREFIX + n``.
SCHEDULE_PREFIX = "schedule:"
#: The name of the step that records each plan in a schedule's memory.
PLAN_STEP = "perdure.schedule.plan"
#: The overlap policies: what a fire does while an earlier run of the schedule is live.
OVERLAPS = ("skip", "buffer_one", "allow_all", "cancel_previous")
#: The most fires one look starts or queues (a catch-up window, a backfill).
MAX_FIRES = 1000
NAME_MAX = 150  # leaves room in a run's id for the fire time
_EPSILON = 1e-6  # a half-open bound made closed
_CONTROL_OPS = ("pause", "resume", "trigger", "backfill", "update", "delete")


def schedule_id(name: str) -> str:
    """The object id of the schedule named ``name``."""
    return SCHEDULE_PREFIX + name


def _stamp(instant: float, *, micro: bool = False) -> str:
    moment = datetime.fromtimestamp(instant, UTC)
    if micro:
        return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def run_id(name: str, fire: float, *, manual: bool = False) -> str:
    """The object id of the run the schedule ``name`` starts for ``fire``:
    ``name@2025-01-31T02:30:00Z``; a manual trigger's ``name@...(microseconds)Z-manual``."""
    if manual:
        return f"{name}@{_stamp(fire, micro=True)}-manual"
    return f"{name}@{_stamp(fire)}"


def jitter_of(name: str, fire: float, jitter: float) -> float:
    """The delay in ``[0, jitter)`` of the run ``name`` starts for ``fire``: the same on
    every node and every replay (a hash, not a random draw)."""
    if jitter <= 0:
        return 0.0
    digest = hashlib.sha256(f"{name}|{fire!r}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 * jitter


def _number(value: Any, what: str) -> float:
    if hasattr(value, "total_seconds"):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(
            value):
        raise ScheduleError(f"{what} is a number of seconds, not {value!r}")
    return float(value)


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """What a schedule runs and when: ``agent(*args, **kwargs)`` at every fire of
    ``cron`` (read in ``timezone``) or every ``interval`` seconds (at the multiples of
    ``interval`` since the epoch), with an ``overlap`` policy, a ``catch_up_window``
    (seconds; ``None``: only the most recent missed fire runs) and a ``jitter`` (each run
    starts up to that many seconds after its fire). ``ScheduleSpec.make`` checks one."""

    name: str
    agent: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    cron: str | None = None
    timezone: str = "UTC"
    interval: int | None = None
    overlap: str = "skip"
    catch_up_window: float | None = None
    jitter: float = 0.0

    @classmethod
    def make(cls, name: str, agent: str, args: Sequence[Any] = (),
             kwargs: Mapping[str, Any] | None = None, *, cron: str | None = None,
             timezone: str | None = None, interval: Any = None, overlap: str = "skip",
             catch_up_window: Any = None, jitter: Any = 0.0) -> ScheduleSpec:
        """A checked spec; ``ScheduleError`` naming what is wrong."""
        check_object_id(name, "schedule name")
        if len(name) > NAME_MAX:
            raise ScheduleError(f"a schedule name has at most {NAME_MAX} characters")
        if "@" in name:
            raise ScheduleError(f"schedule name {name!r} holds '@', which separates a "
                                "schedule's name from the fire time in its runs' ids")
        check_name(agent, "agent name")
        if (cron is None) == (interval is None):
            raise ScheduleError("a schedule takes either cron=... or interval=... (one "
                                "of them)")
        every: int | None = None
        if interval is not None:
            seconds = _number(interval, "interval")
            if seconds < 1 or seconds != int(seconds):
                raise ScheduleError(f"interval is a whole number of seconds, 1 or more, "
                                    f"not {interval!r}")
            every = int(seconds)
            if timezone is not None:
                raise ScheduleError("timezone applies to cron schedules; an interval "
                                    "counts seconds")
        if cron is not None:
            Cron.parse(cron)
        zone = "UTC" if timezone is None else timezone
        _zone(zone)
        if overlap not in OVERLAPS:
            raise ScheduleError(f"overlap is one of {', '.join(OVERLAPS)}, not {overlap!r}")
        window = None if catch_up_window is None else _number(catch_up_window,
                                                              "catch_up_window")
        if window is not None and window < 0:
            raise ScheduleError("catch_up_window is 0 seconds or more (or None)")
        spread = _number(jitter, "jitter")
        if spread < 0:
            raise ScheduleError("jitter is 0 seconds or more")
        return cls(name, agent, tuple(args), dict(kwargs or {}), cron, zone, every,
                   overlap, window, spread)

    def to_body(self) -> dict[str, Any]:
        """As the schedule's memory holds it."""
        body = asdict(self)
        body["args"] = list(self.args)
        return body

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> ScheduleSpec:
        """Read back ``to_body``."""
        return cls(str(body["name"]), str(body["agent"]), tuple(body.get("args", ())),
                   dict(body.get("kwargs", {})), body.get("cron"),
                   str(body.get("timezone", "UTC")), body.get("interval"),
                   str(body.get("overlap", "skip")), body.get("catch_up_window"),
                   float(body.get("jitter", 0.0)))

    @property
    def every(self) -> str:
        """When it fires, in words: ``cron '0 * * * *' (Europe/Paris)`` or
        ``every 60 s``."""
        if self.cron is not None:
            return f"cron {self.cron!r} ({self.timezone})"
        return f"every {self.interval} s"

    def next_after(self, after: float) -> float | None:
        """The first fire strictly after ``after`` (``None``: never again)."""
        if self.interval is not None:
            return float((math.floor(after / self.interval) + 1) * self.interval)
        assert self.cron is not None
        return Cron.parse(self.cron).next_after(after, _zone(self.timezone))

    def latest_at_or_before(self, moment: float) -> float | None:
        """The last fire at or before ``moment`` (within the cron search horizon)."""
        if self.interval is not None:
            return float(math.floor(moment / self.interval) * self.interval)
        back = 60.0
        while back < 40 * 366 * 86400:
            fire = self.next_after(moment - back)
            if fire is not None and fire <= moment:
                while True:
                    later = self.next_after(fire)
                    if later is None or later > moment:
                        return fire
                    fire = later
            back *= 2
        return None

    def count_between(self, low: float, high: float, cap: int) -> int:
        """How many fires fall in ``(low, high]``, counting no further than ``cap``."""
        if self.interval is not None:
            return min(cap, max(0, math.floor(high / self.interval)
                                - math.floor(low / self.interval)))
        count = 0
        fire = self.next_after(low)
        while fire is not None and fire <= high and count < cap:
            count += 1
            fire = self.next_after(fire)
        return count

    def fires_between(self, low: float, high: float, limit: int = MAX_FIRES) -> list[float]:
        """The fires in ``(low, high]``, oldest first, at most ``limit`` (the latest)."""
        if self.interval is not None:
            first = math.floor(low / self.interval) + 1
            last = math.floor(high / self.interval)
            first = max(first, last - limit + 1)
            return [float(k * self.interval) for k in range(first, last + 1)]
        fires: list[float] = []
        fire = self.next_after(low)
        while fire is not None and fire <= high:
            fires.append(fire)
            if len(fires) > limit:
                del fires[0]
            fire = self.next_after(fire)
        return fires


def _zone(name: str) -> ZoneInfo:
    if not isinstance(name, str) or not name:
        raise ScheduleError(f"timezone is an IANA name such as 'Europe/Paris', not {name!r}")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ScheduleError(f"unknown time zone {name!r}; use an IANA name such as "
                            "'Europe/Paris' or 'UTC'") from None


@dataclass(frozen=True, slots=True)
class ScheduleState:
    """What a schedule remembers between looks (recorded with each plan)."""

    cursor: float  # every scheduled fire at or before it has been handled
    paused: bool = False
    deleted: bool = False
    running: tuple[str, ...] = ()  # runs it started that have not ended, as it knew
    buffered: dict[str, Any] | None = None  # a fire waiting for the live run to end
    pending: tuple[dict[str, Any], ...] = ()  # fires asked for (trigger, backfill)
    last_fire: float | None = None
    last_run: str | None = None
    started: int = 0
    skipped: int = 0
    dropped: int = 0  # missed fires older than the catch-up window (or not the latest)

    def to_body(self) -> dict[str, Any]:
        """As a plan's record holds it."""
        body = asdict(self)
        body["running"] = list(self.running)
        body["pending"] = list(self.pending)
        return body

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> ScheduleState:
        """Read back ``to_body``."""
        return cls(float(body["cursor"]), bool(body.get("paused", False)),
                   bool(body.get("deleted", False)), tuple(body.get("running", ())),
                   body.get("buffered"), tuple(body.get("pending", ())),
                   body.get("last_fire"), body.get("last_run"), int(body.get("started", 0)),
                   int(body.get("skipped", 0)), int(body.get("dropped", 0)))


@dataclass(frozen=True, slots=True)
class Plan:
    """One look at a schedule: the runs to start (``{"fire", "id", "start_at"}``), the
    runs to cancel, the state after, when the next scheduled fire is (``None``: paused
    or never), and the runs whose end should wake it (a buffered fire waits for them)."""

    now: float
    start: tuple[dict[str, Any], ...]
    cancel: tuple[str, ...]
    state: ScheduleState
    next_fire: float | None
    watch: tuple[str, ...] = ()

    def to_body(self) -> dict[str, Any]:
        """As the plan step's result records it."""
        return {"now": self.now, "start": list(self.start), "cancel": list(self.cancel),
                "state": self.state.to_body(), "next_fire": self.next_fire,
                "watch": list(self.watch)}

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> Plan:
        """Read back ``to_body``."""
        return cls(float(body["now"]), tuple(body.get("start", ())),
                   tuple(body.get("cancel", ())), ScheduleState.from_body(body["state"]),
                   body.get("next_fire"), tuple(body.get("watch", ())))


def plan(spec: ScheduleSpec, state: ScheduleState, now: float, finished: Collection[str],
         started: Callable[[str], bool]) -> Plan:
    """What the schedule does at ``now``: ``finished`` holds the runs known to have
    ended, ``started(run_id)`` says whether this schedule started that run already."""
    running = [r for r in state.running if r not in finished]
    if state.deleted:
        return Plan(now, (), (), replace(state, running=tuple(running)), None)
    fires: list[dict[str, Any]] = list(state.pending)
    cursor, dropped = state.cursor, state.dropped
    if not state.paused and now > cursor:
        window = spec.catch_up_window
        if window is None:
            latest = spec.latest_at_or_before(now)
            if latest is not None and latest > cursor:
                fires.append({"fire": latest})
                dropped += spec.count_between(cursor, latest, MAX_FIRES) - 1
        else:
            # A fire missed by exactly the window still runs.
            low = max(cursor, now - window - _EPSILON)
            kept = spec.fires_between(low, now, MAX_FIRES)
            if low > cursor:
                dropped += spec.count_between(cursor, low, MAX_FIRES)
            fires.extend({"fire": f} for f in kept)
        cursor = now
    elif state.paused:
        cursor = max(cursor, now)
    starts: list[dict[str, Any]] = []
    cancels: list[str] = []
    buffered = state.buffered
    skipped = state.skipped
    last_fire, last_run = state.last_fire, state.last_run

    def start(item: Mapping[str, Any]) -> None:
        nonlocal last_fire, last_run, skipped
        fire = float(item["fire"])
        manual = bool(item.get("manual"))
        rid = run_id(spec.name, fire, manual=manual)
        if started(rid) or any(s["id"] == rid for s in starts):
            skipped += 1  # that fire ran already (a backfill over it, say)
            return
        begin = fire if manual else fire + jitter_of(spec.name, fire, spec.jitter)
        starts.append({"fire": fire, "id": rid, "start_at": begin})
        running.append(rid)
        last_fire, last_run = fire, rid

    overlap = spec.overlap
    if overlap == "buffer_one" and buffered is not None and not running:
        start(buffered)
        buffered = None
    if overlap == "cancel_previous" and fires:
        skipped += len(fires) - 1  # only the latest would survive the others
        fires = fires[-1:]
    for item in fires:
        if overlap == "allow_all":
            start(item)
        elif overlap == "cancel_previous":
            cancels.extend(r for r in running if r not in cancels)
            running.clear()
            start(item)
        elif not running:
            start(item)
        elif overlap == "buffer_one" and buffered is None:
            buffered = dict(item)
        else:
            skipped += 1
    new_state = replace(state, cursor=cursor, running=tuple(running), buffered=buffered,
                        pending=(), last_fire=last_fire, last_run=last_run,
                        started=state.started + len(starts), skipped=skipped,
                        dropped=dropped)
    next_fire = None if state.paused else spec.next_after(max(now, cursor))
    watch = tuple(running) if buffered is not None else ()
    return Plan(now, tuple(starts), tuple(cancels), new_state, next_fire, watch)


def control_payload(op: str, at: float, **values: Any) -> dict[str, Any]:
    """The payload of a control event: ``op`` (one of pause, resume, trigger, backfill,
    update, delete), the sender's time ``at`` and what the op needs (``start``/``end``
    for backfill, ``spec`` for update)."""
    if op not in _CONTROL_OPS:
        raise ScheduleError(f"a schedule control is one of {', '.join(_CONTROL_OPS)}, "
                            f"not {op!r}")
    return {"op": op, "at": at, **values}


def apply_control(spec: ScheduleSpec, state: ScheduleState, payload: Any
                  ) -> tuple[ScheduleSpec, ScheduleState]:
    """The spec and state after the control event ``payload`` (``control_payload``);
    a payload that is not one is ignored."""
    if not isinstance(payload, dict) or payload.get("op") not in _CONTROL_OPS:
        return spec, state
    op = payload["op"]
    at = float(payload.get("at", state.cursor))
    if op == "pause":
        return spec, replace(state, paused=True)
    if op == "resume":
        return spec, replace(state, paused=False, cursor=max(state.cursor, at))
    if op == "delete":
        return spec, replace(state, deleted=True)
    if op == "trigger":
        return spec, replace(state, pending=(*state.pending, {"fire": at, "manual": True}))
    if op == "backfill":
        low, high = float(payload["start"]), float(payload["end"])
        # [start, end): the fires after start - epsilon, before end
        fires = [f for f in spec.fires_between(low - _EPSILON, high, MAX_FIRES + 1)
                 if f < high]
        return spec, replace(state, pending=(*state.pending,
                                             *({"fire": f} for f in fires[:MAX_FIRES])))
    # update
    try:
        new = ScheduleSpec.from_body(payload["spec"])
    except (KeyError, TypeError, ValueError):
        return spec, state
    return replace(new, name=spec.name), state


@dataclass(frozen=True, slots=True)
class ScheduleInfo:
    """What a schedule's memory says: its spec, whether it is paused or deleted, its
    next and last fire, the runs it started and that are still live as it knows."""

    name: str
    object_id: str
    spec: ScheduleSpec
    state: str  # active | paused | deleted
    next_fire: float | None
    last_fire: float | None
    last_run: str | None
    started: int
    skipped: int
    dropped: int
    running: tuple[str, ...]
    created_at: float
    buffered: float | None = None  # a fire waiting for the live run to end (buffer_one)

    def to_json(self) -> dict[str, Any]:
        """As ``perdure schedules --json`` prints it."""
        return {"name": self.name, "object_id": self.object_id, "state": self.state,
                "every": self.spec.every, "agent": self.spec.agent,
                "overlap": self.spec.overlap, "catch_up_window": self.spec.catch_up_window,
                "jitter": self.spec.jitter, "next_fire": self.next_fire,
                "last_fire": self.last_fire, "last_run": self.last_run,
                "started": self.started, "skipped": self.skipped, "dropped": self.dropped,
                "running": list(self.running), "buffered": self.buffered,
                "spec": self.spec.to_body(),
                "created_at": self.created_at}


def read_schedule(records: Sequence[Record]) -> ScheduleInfo:
    """A schedule's state from its memory: the spec it was made with, then each plan it
    recorded and each control event it received after it. ``ValueError`` if the
    records are not a schedule's."""
    if not records or records[0].kind != Kind.INSTANTIATED:
        raise ValueError("not an object's memory")
    intent = records[0].body["intent"]
    if intent.get("agent") != SCHEDULE_AGENT:
        raise ValueError("not a schedule's memory")
    args = intent.get("args", [])
    spec = ScheduleSpec.from_body(args[0])
    state = ScheduleState(cursor=float(args[1]))
    next_fire = spec.next_after(state.cursor)
    ended = False
    for rec in records[1:]:
        body = rec.body
        if rec.kind == Kind.STEP_DONE and body.get("name") == PLAN_STEP:
            made = Plan.from_body(body["result"])
            state, next_fire = made.state, made.next_fire
        elif rec.kind == Kind.EVENT_RECEIVED and body.get("name") == SCHEDULE_EVENT:
            spec, state = apply_control(spec, state, body.get("payload"))
            if state.paused:
                next_fire = None
            elif body.get("payload", {}).get("op") in ("resume", "update"):
                next_fire = spec.next_after(state.cursor)
        elif rec.kind == Kind.TERMINATED:
            ended = True
    status = ("deleted" if ended or state.deleted else "paused" if state.paused
              else "active")
    return ScheduleInfo(spec.name, schedule_id(spec.name), spec, status,
                        None if status != "active" else next_fire, state.last_fire,
                        state.last_run, state.started, state.skipped, state.dropped,
                        state.running, records[0].ts_us / 1e6,
                        None if state.buffered is None else float(state.buffered["fire"]))
