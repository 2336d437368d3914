"""Every error perdure raises, under one root.

The tree::

    PerdureError
    ├── ConfigurationError        bad settings, store URL, name, id or arguments; missing extra
    │   └── ScheduleError         a schedule's spec is wrong (cron, time zone, interval, ...)
    ├── StoreError                the store cannot be used (down, locked, disk full)
    │   └── StoreCorruptError     the store's bytes are damaged
    ├── NodeIdentityError         this node's key is not certified under the id it acts as
    ├── RecordDecodeError         a memory record cannot be decoded (fails closed)
    ├── IntegrityError            a memory chain or signature does not verify
    │   └── SealBrokenError       a sealed value or a wrapped data key does not decrypt
    ├── DataKeyError              this node cannot open an object's sealed values (no key)
    ├── SerializationError        a value is not JSON-encodable for the memory
    ├── UnknownAgentError         no agent of that name is registered
    ├── UnknownQueueError         no queue of that name is declared on this App
    ├── ObjectNotFoundError       no object with that id
    ├── ObjectConflictError       an object with that id (or dedupe key) exists for another agent
    ├── ObjectTerminatedError     the object has terminated; it takes no more input
    ├── NonDeterminismError       code no longer matches the recorded history
    ├── StepInDoubtError          a non-idempotent step started but its outcome is unknown
    ├── StepFailedError           a step failed for good and its exception cannot be rebuilt
    ├── ChildFailedError          a delegated child object failed or was cancelled
    ├── CannotDo                  raised by a step: this node cannot do it; another node may
    │   └── NodeLacksError        this node lacks a credential or a package the work needs
    ├── ResourceError             (``perdure.resources``) a resource cannot be declared or restored
    │   ├── CannotRestoreError    this node cannot restore it (no binary, no route); another may
    │   ├── DescriptorVersionError  a descriptor's version is one this code does not know
    │   └── ResourceStaleError    a resource no longer matches the world and its policy fails
    ├── AgentFailedError          ``Handle.result()``: the agent terminated with an error
    ├── AgentCancelledError       ``Handle.result()``: the agent was cancelled
    ├── AgentParkedError          ``Handle.result()``: the agent is parked and needs a person
    ├── ResultTimeoutError        ``Handle.result()``: no result within the timeout
    ├── StepTimeoutError          a step's attempt ran past ``run.step(timeout=...)``
    ├── UnknownQueryError         no query of that name is declared for the object's agent
    ├── QueryFailedError          a query's function raised on the object's memory
    ├── ForkError                 a fork point is not one the object can be forked at
    ├── NotParkedError            ``App.retry``: the object is not parked
    ├── ApprovalError             no such proposal waits for a person, or it was decided
    │   └── ApprovalExpiredError  the proposal's deadline passed: it counts as rejected
    ├── ToolCallError             a tool reported that its call failed (an MCP server's error)
    ├── UnknownUpdateError        no update of that name is declared for the object's agent
    ├── UpdateRefusedError        ``App.update``: a validator refused the request (the reason)
    ├── UpdateFailedError         ``App.update``: the handler raised, or the object ended first
    ├── WebhookRefusedError       (``perdure.triggers``) a webhook request is not signed
    │                             right, is too old, or is malformed; ``status`` its HTTP code
    ├── ReplayFailedError         (``perdure.testing``) a recorded history does not replay
    │                             under the current code; ``position`` says where
    ├── BlockedError              (``perdure.testing``) the object waits for what only the
    │                             test can give; nothing in the environment can move
    ├── ModelCallError            (``perdure.llm``) a model call failed; ``.failure`` says
    │                             whether and when to try again
    └── StoredCallError           (``perdure.llm``) a recorded model call does not read back

Control-flow signals derive from ``BaseException`` through ``PerdureSignal``, so that an
agent's ``except Exception`` cannot swallow them, and code that must let every one of
them through catches the root. The first two are public; the others are the engine's
own, defined in the module named beside them: they unwind the agent's code to the node
loop (or to the replay checker), which turns each into what it says::

    PerdureSignal (BaseException)
    ├── LeaseLostError            this node no longer holds the object; stop touching it
    ├── CancelRequestedError      the object was cancelled while it ran
    ├── Suspend                   engine.signals: the object goes dormant, paused or ready
    ├── Park                      engine.signals: the object waits for a person
    ├── DeadlineExceeded          engine.signals: the intent's deadline passed while it ran
    ├── StoreUnavailable          engine.journal: the store failed mid-run; the lease lapses
    └── HistoryEnd                engine.journal: a replay check went past recorded memory

Nothing else perdure defines can reach a user's code: every exception class in the
package is a ``PerdureError`` or a ``PerdureSignal``, except a few ``Exception``s that
never leave their module (the stores' and the failure encoder's internal control flow,
the demo's ``DemoError``); ``tests/test_signals.py`` holds the package to that.
"""

from __future__ import annotations

__all__ = [
    "AgentCancelledError",
    "AgentFailedError",
    "AgentParkedError",
    "ApprovalError",
    "ApprovalExpiredError",
    "BlockedError",
    "CancelRequestedError",
    "CannotDo",
    "CannotRestoreError",
    "ChildFailedError",
    "ConfigurationError",
    "DataKeyError",
    "DescriptorVersionError",
    "ForkError",
    "IntegrityError",
    "LeaseLostError",
    "NodeIdentityError",
    "NodeLacksError",
    "NonDeterminismError",
    "NotParkedError",
    "ObjectConflictError",
    "ObjectNotFoundError",
    "ObjectTerminatedError",
    "PerdureError",
    "PerdureSignal",
    "QueryFailedError",
    "RecordDecodeError",
    "ReplayFailedError",
    "ResourceError",
    "ResourceStaleError",
    "ResultTimeoutError",
    "ScheduleError",
    "SealBrokenError",
    "SerializationError",
    "StepFailedError",
    "StepInDoubtError",
    "StepTimeoutError",
    "StoreCorruptError",
    "StoreError",
    "ToolCallError",
    "UnknownAgentError",
    "UnknownQueryError",
    "UnknownQueueError",
    "UnknownUpdateError",
    "UpdateFailedError",
    "UpdateRefusedError",
    "WebhookRefusedError",
]


class PerdureError(Exception):
    """Root of every error perdure raises."""


class ConfigurationError(PerdureError):
    """A setting or an input is wrong: fix the setting, store URL, name, id or arguments
    named in the message."""


class ScheduleError(ConfigurationError):
    """A schedule's spec is wrong (a bad cron expression, an unknown time zone, an
    interval that is not a whole number of seconds above 0, both or neither of cron and
    interval, an unknown overlap policy, ...). Nothing was stored."""


class StoreError(PerdureError):
    """The store cannot be used right now (unreachable, locked, full). Nothing was written."""


class StoreCorruptError(StoreError):
    """The store's bytes are damaged. Restore the file from a backup; perdure will not guess."""


class NodeIdentityError(PerdureError):
    """This node's key is certified by a trusted root, but not under the node id (or
    person's name) it was told to act as: a key writes, sends and decides only under a
    name its certificate carries."""


class RecordDecodeError(PerdureError):
    """A memory record cannot be decoded. Decoding fails closed: no default is substituted.

    A record that verifies (its signature holds) but does not decode was written by a
    newer perdure than the one reading it; one that does not verify is damaged."""

    def __init__(self, object_id: str, seq: int, reason: str) -> None:
        self.object_id = object_id
        self.seq = seq
        self.reason = reason
        super().__init__(
            f"object {object_id!r}: record #{seq} cannot be decoded ({reason}); "
            f"run `perdure verify {object_id}`: if it passes, a newer perdure wrote the "
            "record (upgrade this one), else restore the store from a backup"
        )


class IntegrityError(PerdureError):
    """A memory chain or signature does not verify; ``seq`` names the first bad record."""

    def __init__(self, object_id: str, seq: int, reason: str) -> None:
        self.object_id = object_id
        self.seq = seq
        self.reason = reason
        super().__init__(f"object {object_id!r}: record #{seq} fails verification: {reason}")


class SealBrokenError(IntegrityError):
    """A sealed value (``perdure.Secret``, an encrypted payload) or an object's wrapped
    data key does not decrypt: its bytes were damaged or forged. Nothing is guessed;
    restore the store (or the data-key row) from a backup."""

    def __init__(self, object_id: str, reason: str, seq: int = 0) -> None:
        PerdureError.__init__(
            self, f"object {object_id!r}: {reason}; the bytes were damaged or forged "
                  f"(run `perdure verify {object_id}`, restore from a backup)")
        self.object_id = object_id
        self.seq = seq
        self.reason = reason


class DataKeyError(PerdureError):
    """This node cannot open (or seal) an object's values: it holds no key-encryption
    key that wrapped the object's data key, or none at all. ``object_id`` and
    ``key_id`` (the key it needs, ``None`` if unknown) say which; give the node that
    key (``docs/howto/secrets.md``) or let a node that has it run the object."""

    def __init__(self, object_id: str, reason: str, key_id: str | None = None) -> None:
        super().__init__(f"object {object_id!r}: {reason}")
        self.object_id = object_id
        self.key_id = key_id
        self.reason = reason


class SerializationError(PerdureError):
    """A value cannot be written to memory: arguments, results and events must be JSON values."""


class UnknownAgentError(PerdureError):
    """No agent of that name is registered with this App."""


class UnknownQueueError(PerdureError):
    """No queue of that name is declared on this App (``App.queue``); nothing was started."""


class ObjectNotFoundError(PerdureError):
    """No object with that id exists in the store."""


class ObjectConflictError(PerdureError):
    """``start`` was given an object id, or a queue's dedupe key, that already belongs to
    a live object of another agent.

    Nothing is created or changed; start the agent under another id or dedupe key.
    """


class ObjectTerminatedError(PerdureError):
    """The object has terminated and accepts no more events or control requests."""


class NonDeterminismError(PerdureError):
    """The agent's code no longer produces its recorded history.

    The object is parked with a record naming the position, what was recorded and
    what the code asked for. Fix the code (or version the agent) and
    ``perdure resume`` it.
    """

    def __init__(self, position: int | str, recorded: str, found: str) -> None:
        self.position = position
        self.recorded = recorded
        self.found = found
        super().__init__(
            f"history mismatch at command #{position}: recorded {recorded}, code asked for {found}"
        )


class StepInDoubtError(PerdureError):
    """A non-idempotent step was started and never finished: it may or may not have happened.

    Raised into the agent on resume instead of silently running the step again. The
    agent may check the side-effect target, retry deliberately, skip, or wait for a
    person.
    """

    def __init__(self, step: str, idempotency_key: str) -> None:
        self.step = step
        self.idempotency_key = idempotency_key
        super().__init__(
            f"step {step!r} (key {idempotency_key}) started before a crash and its outcome "
            "is unknown; check the target for that key before retrying"
        )


class StepFailedError(PerdureError):
    """A step failed for good and its original exception type could not be rebuilt."""

    def __init__(self, step: str, error_type: str, message: str) -> None:
        self.step = step
        self.error_type = error_type
        self.message = message
        super().__init__(f"step {step!r} failed: {error_type}: {message}")


class ChildFailedError(PerdureError):
    """A child object the agent delegated to failed or was cancelled.

    ``outcome`` is ``failed`` or ``cancelled``; ``error_type`` and ``message`` come
    from the child's terminal record.
    """

    def __init__(self, child_id: str, outcome: str, error_type: str, message: str) -> None:
        self.child_id = child_id
        self.outcome = outcome
        self.error_type = error_type
        self.message = message
        super().__init__(f"child {child_id!r} {outcome}: {error_type}: {message}")


class CannotDo(PerdureError):  # noqa: N818 - the name the API promises
    """Raised inside a step: this node cannot do it (no GPU, no licence, wrong region).

    The refusal is recorded in the object's memory as a negative capability of this
    node, the node lets the object go, and another node picks it up. It is not a
    failure and does not count toward retries.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class NodeLacksError(CannotDo):
    """This node lacks something the work needs that another node may have: a credential
    (an API key's environment variable), an installed package or extra.

    Raised anywhere in an object's run (a step, a model call, the agent's own code), it
    is the node's problem, not the object's: the node records a negative capability and
    lets the object go to a node that has what it needs (a restarted node, its setting
    fixed, tries again). The object is never failed for it."""


class ResourceError(PerdureError):
    """A resource (``run.resource``) could not be declared, captured or restored."""


class CannotRestoreError(ResourceError):
    """Raised by a restore recipe: this node cannot bring the resource back (a binary is
    missing, a network is unreachable from here). Recorded as a negative capability of
    this node; the object goes to another node. Not a failure of the object."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class DescriptorVersionError(ResourceError):
    """A recorded descriptor carries a version this code does not understand: the object
    parks rather than guessing (deploy code that knows the version, then resume)."""

    def __init__(self, name: str, type_name: str, version: int, known: tuple[int, ...]
                 ) -> None:
        self.name, self.type_name, self.version, self.known = name, type_name, version, known
        super().__init__(
            f"resource {name!r} ({type_name}) was recorded with descriptor version {version}; "
            f"this code knows version(s) {', '.join(map(str, known)) or 'none'}: run code "
            f"that knows it, then `perdure resume`")


class ResourceStaleError(ResourceError):
    """A resource no longer matches the world (``reason``) and its ``on_stale`` policy is
    ``fail``: the object fails with this error."""

    def __init__(self, name: str, reason: str) -> None:
        self.name, self.reason = name, reason
        super().__init__(f"resource {name!r} is stale: {reason}")


class AgentFailedError(PerdureError):
    """The agent terminated with an error; ``error_type`` and ``message`` say which."""

    def __init__(self, object_id: str, error_type: str, message: str) -> None:
        self.object_id = object_id
        self.error_type = error_type
        self.message = message
        super().__init__(f"object {object_id!r} failed: {error_type}: {message}")


class AgentCancelledError(PerdureError):
    """The agent was cancelled before it finished."""


class AgentParkedError(PerdureError):
    """The agent is parked (for example after a non-determinism error) and needs a person."""


class ResultTimeoutError(PerdureError, TimeoutError):
    """No result arrived within the timeout; the object keeps running."""


class StepTimeoutError(PerdureError, TimeoutError):
    """A step's attempt ran longer than its ``timeout``: recorded as a failure of class
    ``timeout`` and retried by the step's retry policy (semantic backoff)."""


class UnknownQueryError(PerdureError):
    """No query of that name is declared for the object's agent (``App.query``)."""


class QueryFailedError(PerdureError):
    """A query's function raised while reading an object's memory; ``__cause__`` holds
    what it raised. Nothing was written."""


class ForkError(PerdureError):
    """An object cannot be forked at that record: the message says why and which
    records are fork points near it. Nothing was written."""


class NotParkedError(PerdureError):
    """``App.retry`` was asked for an object that is not parked."""


class UnknownUpdateError(PerdureError):
    """No update of that name is declared for the object's agent (``App.update``)."""


class UpdateRefusedError(PerdureError):
    """An update request was refused by a validator: in the caller (nothing was written)
    or, rarely, by the object (its receipt and the refusal are in memory)."""


class UpdateFailedError(PerdureError):
    """An accepted update's handler raised (its reply says what), or the object ended
    before it took the update."""


class WebhookRefusedError(PerdureError):
    """A webhook request is refused before anything is applied: not signed, a signature
    that does not match, a timestamp outside the replay window, malformed headers.
    ``status`` is the HTTP status it is answered with, ``kind`` the problem's short
    name (``bad-signature``, ``stale-timestamp``, ``future-timestamp``, ``malformed``)."""

    def __init__(self, status: int, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.kind = kind


class ApprovalError(PerdureError):
    """A decision on a tool call cannot be sent: no such proposal waits for a person
    (see ``perdure approvals``), or it was decided already."""


class ApprovalExpiredError(ApprovalError):
    """A decision on a tool call came after the proposal's deadline
    (``Policy(approval_ttl=...)``): the call counts as rejected and will not run. Nothing
    was sent; the agent is told the call expired when it next runs."""


class ToolCallError(PerdureError):
    """A tool reported that its call failed (an MCP server's error result); recorded as
    the call's failure, and the model is told."""


class ReplayFailedError(PerdureError):
    """A recorded history (``perdure.testing.History``, a file checked into a repository)
    does not replay under the current code: ``verdict`` is ``diverges`` (the code asks
    for something else at ``position``: memory ``recorded`` one command, the code asks
    for ``found``) or ``error`` (the agent raised while replaying; ``detail`` says what).
    ``path`` names the file, if the history came from one."""

    def __init__(self, object_id: str, verdict: str, detail: str, *,
                 position: int | str | None = None, recorded: str | None = None,
                 found: str | None = None, path: str | None = None) -> None:
        self.object_id = object_id
        self.verdict = verdict
        self.detail = detail
        self.position = position
        self.recorded = recorded
        self.found = found
        self.path = path
        where = f"{path}: " if path else ""
        super().__init__(f"{where}object {object_id!r} does not replay under this code: "
                         f"{verdict}: {detail}")


class BlockedError(PerdureError):
    """``perdure.testing``: the object waits for what only the test can give (an event,
    an answer, an approval, a resume) and nothing in the environment can move, not even
    by skipping time. ``waiting`` (a ``perdure.testing.Summary``) says what it waits
    for; answer it (``env.answer``, ``env.approve``, ``handle.send``) and run again."""

    def __init__(self, object_id: str, message: str, waiting: object = None) -> None:
        self.object_id = object_id
        self.waiting = waiting
        super().__init__(message)


class PerdureSignal(BaseException):
    """Control flow that user code must not swallow."""


class LeaseLostError(PerdureSignal):
    """This node no longer holds the object's lease; its writes are refused."""


class CancelRequestedError(PerdureSignal):
    """The object was cancelled while running."""
