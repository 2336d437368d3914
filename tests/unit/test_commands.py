"""How ``Run`` is put together: each command is a function of its module in
``perdure.engine.commands``, bound on ``Run`` as a method (no forwarding call between
``run.step(...)`` and the step's code), and the API agents see stays as it was."""

from __future__ import annotations

import asyncio
import inspect
import typing
from typing import Any

import pytest

import perdure
from perdure.core.intent import Intent
from perdure.core.lifecycle import Status
from perdure.core.records import Kind
from perdure.engine.commands import (
    agent_loop,
    emits,
    intent,
    lineage,
    model,
    resources,
    steps,
    values,
    waits,
)
from perdure.engine.commands.lineage import _combined, _unwinding
from perdure.engine.journal import StoreUnavailable
from perdure.engine.replay import replay_check
from perdure.engine.run import Run
from perdure.engine.signals import DeadlineExceeded, Park, Suspend
from perdure.engine.worker import AgentDef
from perdure.errors import CancelRequestedError, LeaseLostError, StoreError
from tests.unit.builders import chain, instantiated

COMMANDS = {
    "agent": agent_loop.agent,
    "step": steps.step,
    "sleep": waits.sleep,
    "wait_for": waits.wait_for,
    "now": values.now,
    "uuid": values.uuid,
    "random": values.random,
    "progress": values.progress,
    "emit": emits.emit,
    "refine": intent.refine,
    "patched": intent.patched,
    "deprecate_patch": intent.deprecate_patch,
    "delegate": lineage.delegate,
    "options": lineage.options,
    "join": lineage.join,
    "gather": lineage.gather,
    "model": model.model,
    "resource": resources.resource,
    "release": resources.release,
    "checkpoint_resources": resources.checkpoint_resources,
    "holding": resources.holding,
}

# What agents see, as it was before the commands moved to their modules: the
# signature of each bound method and whether it must be awaited. Start options went
# apart from an agent's arguments: ``delegate`` passes every argument to the child's
# agent and ``options(object_id=...)`` names the child; ``next_position`` is what an
# adapter asks for the position its next command will take.
SURFACE = {
    "Run.resource": ("(name: 'str', recipe: 'Resource[T]') -> 'T'", True),
    "Run.release": ("(name: 'str') -> 'None'", True),
    "Run.checkpoint_resources": ("(*names: 'str') -> 'int'", True),
    "Run.holding": ("(name: 'str', recipe: 'Resource[T]') -> 'AsyncIterator[T]'", False),
    "SyncRun.resource": ("(name: 'str', recipe: 'Resource[T]') -> 'T'", False),
    "SyncRun.release": ("(name: 'str') -> 'None'", False),
    "SyncRun.checkpoint_resources": ("(*names: 'str') -> 'int'", False),
    "Run.check_finished": ("() -> 'None'", False),
    "Run.delegate": ("(agent: 'Callable[..., Any] | str', /, *args: 'Any', "
                     "**kwargs: 'Any') -> 'ChildHandle'", True),
    "Run.options": ("(*, object_id: 'str | None' = None) -> 'ChildStarter'", False),
    "Run.next_position": ("() -> 'str'", False),
    "Run.deprecate_patch": ("(name: 'str') -> 'None'", False),
    "Run.gather": ("(*branches: 'Awaitable[Any]') -> 'list[Any]'", True),
    "Run.agent": ("(client: 'ModelClient | Sequence[ModelClient | tuple[ModelClient, str]]', "
                  "*, model: 'str', messages: 'Sequence[Message]', "
                  "tools: 'Sequence[Tool | Callable[..., Any]] | Mapping[str, Tool]' = (), "
                  "policy: 'Policy', max_turns: 'int' = 10, max_tokens: 'int | None' = None, "
                  "deadline: 'float | None' = None, params: 'ModelParams | None' = None, "
                  "stream: 'bool' = False, name: 'str' = 'agent') -> 'AgentResult'", True),
    "SyncRun.agent": ("(client: 'ModelClient | Sequence[ModelClient | tuple[ModelClient, "
                      "str]]', **options: 'Any') -> 'AgentResult'", False),
    "Run.join": ("(*children: 'ChildHandle | str') -> 'list[Any]'", True),
    "Run.model": ("(client: 'ModelClient | Sequence[ModelClient | tuple[ModelClient, str]]', "
                  "request: 'ModelRequest | None' = None, *, model: 'str | None' = None, "
                  "messages: 'Sequence[Message]' = (), tools: 'Sequence[ToolSpec]' = (), "
                  "params: 'ModelParams | None' = None, stream: 'bool' = False, "
                  "name: 'str | None' = None, prices: 'PriceTable | None' = None, "
                  "retry: 'RetryPolicy | None' = None, wait_up_to: 'float' = 10.0, "
                  "recovery: 'Recovery | str' = 'continue', "
                  "flush: 'FlushPolicy | None' = None, "
                  "context: 'ContextPolicy | None' = None) -> 'ModelReply'", True),
    "Run.now": ("() -> 'float'", True),
    "Run.patched": ("(name: 'str') -> 'bool'", False),
    "Run.progress": ("(**fields: 'Any') -> 'None'", True),
    "Run.random": ("() -> 'float'", True),
    "Run.refine": ("(**changes: 'Any') -> 'Intent'", True),
    "Run.sleep": ("(seconds: 'float') -> 'None'", True),
    "Run.step": ("(fn: 'Callable[..., Any]', *args: 'Any', name: 'str | None' = None, "
                 "idempotent: 'bool | None' = None, retry: 'RetryPolicy | None' = None, "
                 "requires: 'set[str] | frozenset[str] | None' = None, "
                 "timeout: 'float | None' = None, **kwargs: 'Any') -> 'Any'", True),
    "Run.uuid": ("() -> 'str'", True),
    "Run.wait_for": ("(event: 'str', *, timeout: 'float | None' = None, prompt: 'Any' = None, "
                     "choices: 'Sequence[Any] | None' = None) -> 'Any'", True),
    "Run.emit": ("(name: 'str', data: 'Any' = None) -> 'None'", True),
    "Run.on_update": ("(name: 'str', handler: 'Callable[..., Any]', *, "
                      "validator: 'Callable[..., Any] | None' = None) -> 'None'", False),
    "SyncRun.delegate": ("(agent: 'Callable[..., Any] | str', /, *args: 'Any', "
                         "**kwargs: 'Any') -> 'SyncChildHandle'", False),
    "SyncRun.options": ("(*, object_id: 'str | None' = None) -> 'SyncChildStarter'", False),
    "SyncRun.deprecate_patch": ("(name: 'str') -> 'None'", False),
    "SyncRun.join": ("(*children: 'SyncChildHandle | str') -> 'list[Any]'", False),
    "SyncRun.model": ("(client: 'ModelClient | Sequence[ModelClient | tuple[ModelClient, "
                      "str]]', request: 'ModelRequest | None' = None, **options: 'Any') "
                      "-> 'ModelReply'", False),
    "SyncRun.now": ("() -> 'float'", False),
    "SyncRun.patched": ("(name: 'str') -> 'bool'", False),
    "SyncRun.progress": ("(**fields: 'Any') -> 'None'", False),
    "SyncRun.random": ("() -> 'float'", False),
    "SyncRun.refine": ("(**changes: 'Any') -> 'Intent'", False),
    "SyncRun.sleep": ("(seconds: 'float') -> 'None'", False),
    "SyncRun.step": ("(fn: 'Callable[..., Any]', *args: 'Any', **kwargs: 'Any') -> 'Any'",
                     False),
    "SyncRun.uuid": ("() -> 'str'", False),
    "SyncRun.wait_for": ("(event: 'str', *, timeout: 'float | None' = None, "
                         "prompt: 'Any' = None, choices: 'Sequence[Any] | None' = None) "
                         "-> 'Any'", False),
    "SyncRun.emit": ("(name: 'str', data: 'Any' = None) -> 'None'", False),
}


def _bound_signature(method: Any) -> str:
    """The signature as an instance's method shows it (without ``self``)."""
    sig = inspect.signature(method)
    return str(sig.replace(parameters=list(sig.parameters.values())[1:]))


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_command_is_its_module_function(name: str) -> None:
    """``Run.<command>`` is the command module's function itself: no forwarding layer."""
    assert inspect.getattr_static(Run, name) is COMMANDS[name]
    assert COMMANDS[name].__module__.startswith("perdure.engine.commands.")


def test_every_public_method_is_in_the_surface() -> None:
    """The public methods of ``Run`` and ``SyncRun`` are exactly those listed."""
    found = {
        f"{cls.__name__}.{name}"
        for cls in (perdure.Run, perdure.SyncRun)
        for name, value in inspect.getmembers(cls)
        if not name.startswith("_") and inspect.isfunction(value)
    }
    assert found == set(SURFACE)


@pytest.mark.parametrize("qualified", sorted(SURFACE))
def test_the_surface_is_unchanged(qualified: str) -> None:
    """Each method keeps its signature, its await-ness and a docstring."""
    cls_name, name = qualified.split(".")
    method = getattr(getattr(perdure, cls_name), name)
    signature, awaited = SURFACE[qualified]
    assert _bound_signature(method) == signature
    assert inspect.iscoroutinefunction(method) is awaited
    assert inspect.getdoc(method)


@pytest.mark.parametrize("cls", [perdure.Run, perdure.SyncRun], ids=lambda c: c.__name__)
def test_step_keeps_its_overloads(cls: type) -> None:
    """``step`` still has its two overloads (an awaitable function and a plain one)."""
    overloads = typing.get_overloads(inspect.getattr_static(cls, "step"))
    assert [str(inspect.signature(f).parameters["fn"].annotation) for f in overloads] == [
        "Callable[..., Awaitable[T]]", "Callable[..., T]"]


# -- gather: which branch outcome wins -------------------------------------------------


def _store_down() -> StoreUnavailable:
    return StoreUnavailable(StoreError("down"))


def test_gather_raises_the_most_urgent_signal_whatever_the_order() -> None:
    """A park beats a lost lease, which beats a cancel, which beats the deadline, in any
    branch order; each beats a dormant branch and a plain failure."""
    park = Park(RuntimeError("look"))
    lost, cancel, late = LeaseLostError("x"), CancelRequestedError("x"), DeadlineExceeded("x")
    sleeping = Suspend([], ready_at=1.0)
    assert _unwinding([ValueError(), sleeping, late, cancel, lost, park]) is park
    assert _unwinding([late, cancel, lost, None]) is lost
    assert _unwinding([late, cancel]) is cancel
    assert _unwinding([ValueError(), late, sleeping]) is late


def test_gather_raises_other_signals_in_branch_order_after_the_urgent_ones() -> None:
    """A store that failed (or the loop's cancellation) unwinds gather in branch order,
    after any urgent signal and before dormant branches and plain failures."""
    down, cancelled = _store_down(), asyncio.CancelledError()
    assert _unwinding([ValueError(), down, cancelled]) is down
    assert _unwinding([cancelled, down]) is cancelled
    late = DeadlineExceeded("x")
    assert _unwinding([down, late]) is late
    assert _unwinding([ValueError(), Suspend([], ready_at=None), None]) is None


def test_dormant_branches_combine_into_one_suspend() -> None:
    """The earliest wake-up and the first non-dormant status win; one dormant record."""
    combined = _combined(3, (), [
        Suspend([], ready_at=5.0, reason="a"),
        Suspend([], ready_at=2.0, status=Status.PAUSED, reason="b"),
    ])
    assert (combined.ready_at, combined.status, combined.reason) == (2.0, Status.PAUSED, "a; b")
    assert combined.drafts == []
    dormant = _combined(3, (), [Suspend([], ready_at=5.0, waiting_event="go", reason="a")])
    assert dormant.status == Status.DORMANT == "dormant"
    assert [d.body for d in dormant.drafts] == [{
        "pos": 3, "cmd": "gather", "reason": "gather", "wake_at": 5.0, "event": "go",
        "children": []}]


# -- positions: the main line and gather branches ----------------------------------------


def _done(pos: int | str, name: str, result: Any) -> tuple[Kind, dict[str, Any]]:
    return (Kind.STEP_DONE, {"pos": pos, "cmd": "step", "name": name, "attempt": 1,
                             "latency": 0.0, "result": result})


def test_steps_replay_from_branches_and_from_the_main_line_after_a_gather() -> None:
    """Before a gather, in its branches and after it, each step replays its own record:
    a run that has gathered asks the branch context again on its main line."""
    records = chain([_done(0, "a", 1), _done("1.0.0", "b", 2), _done("1.1.0", "c", 3),
                     _done(2, "d", 4)], first=instantiated(Intent(agent="probe", version="1")))
    seen: list[Any] = []

    async def probe(run: Run) -> None:
        seen.append(await run.step(lambda: 0, name="a"))
        seen.append(await run.gather(run.step(lambda: 0, name="b"),
                                     run.step(lambda: 0, name="c")))
        seen.append(await run.step(lambda: 0, name="d"))
        seen.append(await run.step(lambda: 0, name="new"))  # past memory: the check ends

    agents = {"probe": AgentDef("probe", "1", probe, True)}
    report = asyncio.run(replay_check(agents, records))
    assert report.verdict == "compatible", report
    assert seen == [1, [2, 3], 4]
