"""Input rules that give the same answer on every store, and ``App.start`` on a taken id.

Names, ids and arguments are checked before the store is touched, so SQLite and
PostgreSQL refuse the same input with the same ``ConfigurationError`` or
``SerializationError`` and store nothing. Each rule is checked through the API on both
backends and through the ``perdure`` CLI (exit 1, one ``error:`` line, no traceback).
A start under a taken id returns the existing object (saying what differs) or, when
the id belongs to another agent, raises ``ObjectConflictError``.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import perdure
from perdure.errors import ConfigurationError, ObjectConflictError, SerializationError

MakeApp = Callable[..., perdure.App]


def _nested(depth: int) -> Any:
    """A list nested ``depth`` levels: ``_nested(2) == [[0]]``."""
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


def _first(app: perdure.App, object_id: str) -> dict[str, Any]:
    """The body of the object's ``instantiated`` record: its intent and context."""
    return next(r.body for r in app.history(object_id) if r.kind == perdure.Kind.INSTANTIATED)


@pytest.fixture
def app(make_app: MakeApp) -> perdure.App:
    """An App with ``greet(who)`` and ``echo(value)``, both finishing at once."""
    built = make_app()

    @built.agent(name="greet")
    async def greet(run: perdure.Run, who: str, punctuation: str = "!") -> str:
        return f"hi {who}{punctuation}"

    @built.agent(name="echo")
    def echo(run: perdure.SyncRun, value: Any) -> Any:
        return value

    return built


# -- ids, labels, event names and dedupe keys through the API -----------------------------

BAD_IDS = [
    ("", "object id is empty"),
    ("two words", "holds whitespace (U+0020 at position 3)"),
    ("tab\there", "holds a control character (U+0009 at position 3)"),
    ("nul\x00", "holds a control character (U+0000 at position 3)"),
    ("lone\ud800", "holds a lone surrogate (U+D800 at position 4)"),
    ("evil\u202etxt.exe", "holds an invisible format character (U+202E at position 4)"),
    ("x" * 201, "is too long"),
]


@pytest.mark.parametrize(("bad", "rule"), BAD_IDS)
def test_start_refuses_bad_object_ids(app: perdure.App, bad: str, rule: str) -> None:
    """A bad object id (an empty one included: only None means "generate one") is a
    ConfigurationError naming the rule; nothing is stored."""
    with pytest.raises(ConfigurationError) as caught:
        app.options(object_id=bad).start("greet", "ana")
    assert rule in str(caught.value)
    assert "use 1-200 characters without whitespace, control or format characters" in str(
        caught.value)
    assert app.list() == []


def test_start_without_an_id_generates_one(app: perdure.App) -> None:
    """``object_id=None`` generates a fresh id each time: two starts, two objects."""
    first, second = app.start("greet", "ana"), app.start("greet", "ana")
    assert first.created and second.created
    assert first.object_id != second.object_id
    assert len(app.list()) == 2


@pytest.mark.parametrize(
    ("labels", "rule"),
    [
        ({"": "x"}, "label key is empty"),
        ({"team\x00": "x"}, "label key 'team\\x00' holds a control character"),
        ({"team": "a\nb"}, "label 'team' value 'a\\nb' holds a control character"),
        ({"team": "\udcff"}, "lone surrogate"),
        ({"team": 7}, "label 'team' value must be a string, not int"),
        ({"team": "v" * 1001}, "use 1-1000 characters"),
        (["team"], "labels must be a mapping"),
    ],
)
def test_start_refuses_bad_labels(app: perdure.App, labels: Any, rule: str) -> None:
    """Label keys and values are names (values up to 1000 characters); nothing is stored."""
    with pytest.raises(ConfigurationError) as caught:
        app.options(object_id="o-1", labels=labels).start("greet", "ana")
    assert rule in str(caught.value)
    assert app.list() == []


def test_good_labels_are_recorded(app: perdure.App) -> None:
    """Labels with spaces and any script are kept as given in the object's context."""
    labels = {"team": "data science", "owner": "Zoë", "emoji": "👩\u200d💻"}
    app.options(object_id="o-1", labels=labels).start("greet", "ana")
    assert _first(app, "o-1")["context"]["labels"] == labels


@pytest.mark.parametrize(
    ("event", "dedupe_key", "rule"),
    [
        ("", None, "event name is empty"),
        ("go\x00", None, "event name 'go\\x00' holds a control character"),
        ("go\ud800", None, "event name 'go\\ud800' holds a lone surrogate"),
        ("perdure:refine", None, "is reserved"),
        ("g" * 201, None, "is too long"),
        ("go", "", "dedupe key is empty"),
        ("go", "k\x00", "dedupe key 'k\\x00' holds a control character"),
        ("go", "k\udcff", "dedupe key 'k\\udcff' holds a lone surrogate"),
        ("go", "k" * 201, "is too long"),
    ],
)
def test_send_refuses_bad_event_names_and_dedupe_keys(app: perdure.App, event: str,
                                                      dedupe_key: str | None,
                                                      rule: str) -> None:
    """Event names and dedupe keys are names; a bad one queues nothing."""
    app.options(object_id="o-1").start("greet", "ana")
    with pytest.raises(ConfigurationError) as caught:
        app.send("o-1", event, {"ok": True}, dedupe_key=dedupe_key)
    assert rule in str(caught.value)
    assert app.store.pending_events("o-1") == []


def test_send_accepts_names_with_spaces(app: perdure.App) -> None:
    """Spaces and format characters are fine inside an event name or dedupe key."""
    app.options(object_id="o-1").start("greet", "ana")
    assert app.send("o-1", "approval granted", 1, dedupe_key="by ana \u200d")
    assert [e.name for e in app.store.pending_events("o-1")] == ["approval granted"]


def test_refine_refuses_bad_input(app: perdure.App) -> None:
    """A refinement with a bad object id, an unknown field, a bad value or a bad
    capability name is a ConfigurationError, and nothing is queued."""
    app.options(object_id="o-1").start("greet", "ana")
    with pytest.raises(ConfigurationError, match="object id 'o\\\\x00' holds a control"):
        app.refine("o\x00", deadline=5)
    with pytest.raises(ConfigurationError, match=r"cannot refine object 'o-1': intent fields "
                                                 r"\['colour'\] cannot be refined"):
        app.refine("o-1", colour="blue")
    with pytest.raises(ConfigurationError, match="goal must be a dict"):
        app.refine("o-1", goal="all")
    with pytest.raises(ConfigurationError, match="required capability 'g\\\\npu' holds"):
        app.refine("o-1", requires=["g\npu"])
    for needs in (5, None):  # not a collection at all
        with pytest.raises(ConfigurationError, match=r"cannot refine object 'o-1': requires "
                                                     r"must be a collection of capability"):
            app.refine("o-1", requires=needs)
    with pytest.raises(SerializationError, match="refinement cannot be stored"):
        app.refine("o-1", goal={"deep": _nested(200)})
    assert app.store.pending_events("o-1") == []


def test_node_ids_and_agent_names(make_app: MakeApp) -> None:
    """A node id is an id, an agent's name, version and required capabilities are names:
    bad ones are refused when the App is built or the agent registered."""
    with pytest.raises(ConfigurationError, match="node id 'node 1' holds whitespace"):
        make_app(node_id="node 1")
    with pytest.raises(ConfigurationError, match="node id is empty"):
        make_app(node_id="")
    built = make_app(node_id="node-\u00e9")

    def agent(run: perdure.Run) -> None: ...

    for options, rule in [({"name": "a\x00"}, "agent name 'a\\x00' holds a control"),
                          ({"name": ""}, "agent name is empty"),
                          ({"version": "1\n"}, "agent version '1\\n' holds a control"),
                          ({"requires": {"gpu\x00"}}, "required capability 'gpu\\x00'")]:
        with pytest.raises(ConfigurationError) as caught:
            built.agent(**options)(agent)
        assert rule in str(caught.value)
    assert built.agents == {}


# -- arguments: JSON values, nesting, and the agent's signature ---------------------------


@pytest.mark.parametrize(
    ("args", "kwargs", "rule"),
    [
        ((_nested(100_000),), {}, "nest more than 128 levels"),
        ((_nested(129),), {}, "nest more than 128 levels"),
        ((), {"value": {"k": _nested(128)}}, "nest more than 128 levels"),
        ((["ok", "\ud800"],), {}, "surrogates not allowed"),
        (({"k\udcff": 1},), {}, "surrogates not allowed"),
    ],
)
def test_arguments_that_cannot_be_stored(app: perdure.App, args: tuple[Any, ...],
                                         kwargs: dict[str, Any], rule: str) -> None:
    """Arguments nested too deeply (even 100,000 levels: no RecursionError) or holding a
    lone surrogate are a SerializationError naming the agent; nothing is stored."""
    with pytest.raises(SerializationError) as caught:
        app.options(object_id="o-1").start("echo", *args, **kwargs)
    assert "arguments of agent 'echo' cannot be stored" in str(caught.value)
    assert rule in str(caught.value)
    assert app.list() == []


def test_arguments_at_the_depth_bound_round_trip(app: perdure.App) -> None:
    """An argument nested exactly 128 levels is stored, run and returned as it was."""
    value = _nested(128)
    handle = app.options(object_id="o-1").start("echo", value)
    with app.background_worker():
        assert handle.result(timeout=10) == value
    assert app.verify("o-1").ok


def test_payloads_that_cannot_be_stored(app: perdure.App) -> None:
    """An event payload nested too deeply or holding a lone surrogate is refused too."""
    app.options(object_id="o-1").start("greet", "ana")
    with pytest.raises(SerializationError, match=r"payload of event 'go'.*128 levels"):
        app.send("o-1", "go", _nested(100_000))
    with pytest.raises(SerializationError, match="surrogates not allowed"):
        app.send("o-1", "go", {"text": "\udcff"})
    assert app.store.pending_events("o-1") == []


@pytest.mark.parametrize(
    ("args", "kwargs", "reason"),
    [
        ((), {}, "missing a required argument: 'who'"),
        (("ana", "!", "extra"), {}, "too many positional arguments"),
        (("ana",), {"colour": "blue"}, "got an unexpected keyword argument 'colour'"),
        (("ana",), {"who": "bob"}, "multiple values for argument 'who'"),
    ],
)
def test_arguments_must_match_the_signature(app: perdure.App, args: tuple[Any, ...],
                                            kwargs: dict[str, Any], reason: str) -> None:
    """Arguments the agent function cannot take are a ConfigurationError naming the
    agent, its signature without the run, and what is wrong; nothing is stored."""
    with pytest.raises(ConfigurationError) as caught:
        app.options(object_id="o-1").start("greet", *args, **kwargs)
    assert str(caught.value) == (
        f"agent 'greet' takes (who: str, punctuation: str = '!'): {reason}; "
        "pass arguments that match"
    )
    assert app.list() == []


# -- App.start on an id that is taken ----------------------------------------------------


def test_a_new_object_is_created(app: perdure.App) -> None:
    """A start that creates its object says so: ``created`` is true, nothing differs."""
    handle = app.options(object_id="o-1").start("greet", "ana")
    assert (handle.object_id, handle.created, handle.differs) == ("o-1", True, None)


def test_same_agent_same_arguments_returns_the_object(app: perdure.App) -> None:
    """Starting the same agent with the same arguments again returns the existing object
    (keywords in another order are the same start); nothing is added."""
    app.options(object_id="o-1", labels={"team": "a"}, max_failures=3).start(
        "greet", who="ana", punctuation="?")
    records = app.store.records("o-1")
    again = app.options(object_id="o-1", labels={"team": "a"}, max_failures=3).start(
        "greet", punctuation="?", who="ana")
    assert (again.object_id, again.created, again.differs) == ("o-1", False, None)
    assert app.store.records("o-1") == records
    assert len(app.list()) == 1


def test_same_agent_other_arguments_says_what_differs(app: perdure.App) -> None:
    """Other arguments return the existing object, untouched, with ``differs`` naming
    the recorded and the asked arguments in one sentence."""
    app.options(object_id="demo-1").start("echo", 3)
    records = app.store.records("demo-1")
    again = app.options(object_id="demo-1").start("echo", 5)
    assert again.created is False
    assert again.differs == (
        "object 'demo-1' already exists with other arguments: recorded args=[3] kwargs={}, "
        "asked args=[5] kwargs={}"
    )
    assert app.store.records("demo-1") == records
    with app.background_worker():
        assert again.result(timeout=10) == 3


def test_other_labels_budget_or_deadline_differ_too(app: perdure.App) -> None:
    """Labels, the failure budget and whether a deadline was given count as differences."""
    app.options(object_id="o-1").start("greet", "ana")
    again = app.options(object_id="o-1", labels={"team": "a"}, deadline=60, max_failures=2).start(
        "greet", "ana")
    assert again.differs == (
        "object 'o-1' already exists with other labels, failure budget and deadline: "
        'recorded labels={} max_failures=null deadline=none, asked labels={"team":"a"} '
        "max_failures=2 deadline=in 60s"
    )


def test_another_agents_id_is_a_conflict(app: perdure.App) -> None:
    """An id taken by another agent's object raises ObjectConflictError saying which
    agent has it and what to do; that object is left as it was."""
    app.options(object_id="o-1").start("greet", "ana")
    records = app.store.records("o-1")
    with pytest.raises(ObjectConflictError) as caught:
        app.options(object_id="o-1").start("echo", "ana")
    assert str(caught.value) == (
        "object 'o-1' already exists and runs agent 'greet', not 'echo'; start 'echo' under "
        "another object id"
    )
    assert isinstance(caught.value, perdure.PerdureError)
    assert app.store.records("o-1") == records
    assert [info.agent for info in app.list()] == ["greet"]


def _start_after(barrier: threading.Barrier, app: perdure.App, object_id: str,
                 handles: list[perdure.Handle]) -> None:
    barrier.wait()
    handles.append(app.options(object_id=object_id).start("greet", "ana"))


def test_racing_starts_create_one_object(app: perdure.App, make_app: MakeApp) -> None:
    """Starts of one id racing from two Apps create it once: exactly one handle says
    ``created``, every other one returns that object with nothing differing."""
    other = make_app()
    other.agent(name="greet")(app.agents["greet"].fn)
    for k in range(5):
        handles: list[perdure.Handle] = []
        barrier = threading.Barrier(4)
        threads = [threading.Thread(target=_start_after, args=(barrier, a, f"race-{k}", handles))
                   for a in (app, other) * 2]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        assert sorted(h.created for h in handles) == [False, False, False, True]
        assert {h.differs for h in handles} == {None}
    assert len(app.list()) == 5


# -- the same rules through the CLI ------------------------------------------------------

CLI_AGENTS = textwrap.dedent(
    """
    import perdure

    app = perdure.App(store="sqlite:///never-used.db")


    @app.agent(name="hello")
    def hello(run: perdure.SyncRun, who: str) -> str:
        return f"hello {who}"


    @app.agent(name="other")
    def other(run: perdure.SyncRun, who: str) -> str:
        return who
    """
)


def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "perdure", *args],
        capture_output=True, text=True, timeout=60, check=False, cwd=cwd,
        errors="surrogateescape",
    )


def _one_error_line(done: subprocess.CompletedProcess[str], *needles: str) -> None:
    """The CLI failed with exit 1 and exactly one ``error:`` line holding ``needles``."""
    assert done.returncode == 1, done
    assert "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_cli_applies_the_same_rules(store_url: str, tmp_path: Path,
                                    make_app: MakeApp) -> None:
    """``perdure start`` and ``perdure send`` refuse bad ids, event names, arguments that
    do not match or nest too deeply, and another agent's id, in one line each; the
    store keeps only what was rightly started."""
    (tmp_path / "agents.py").write_text(CLI_AGENTS)
    common = ("--store", store_url, "--key-dir", str(tmp_path / "keys"), "--app", "agents:app")

    def start(*args: str) -> subprocess.CompletedProcess[str]:
        return _cli(tmp_path, *common, "start", *args)

    for bad, needle in [("", "object id is empty"),
                        ("two words", "holds whitespace"),
                        ("bell\x07", "holds a control character (U+0007"),
                        ("evil\u202etxt", "format character (U+202E"),
                        ("x" * 201, "is too long")]:
        _one_error_line(start("hello", "--args", '["ana"]', "--id", bad), needle)
    _one_error_line(start("hello", "--id", "c-1"), "agent 'hello' takes (who: str)",
                    "missing a required argument: 'who'")
    _one_error_line(start("hello", "--args", '["ana"]', "--kwargs", '{"mood": 1}',
                          "--id", "c-1"), "unexpected keyword argument 'mood'")
    deep = "[" * 200 + "]" * 200
    _one_error_line(start("hello", "--args", f"[{deep}]", "--id", "c-1"),
                    "nest more than 128 levels")
    reader = make_app()
    assert reader.list() == []

    done = start("hello", "--args", '["ana"]', "--id", "c-1")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "c-1"
    done = start("hello", "--args", '["bob"]', "--id", "c-1")
    assert done.returncode == 0, done.stderr  # the existing object, with a warning
    assert done.stdout.strip() == "c-1"
    assert ("warning: object 'c-1' already exists with other arguments: recorded "
            'args=["ana"] kwargs={}, asked args=["bob"] kwargs={}') in done.stderr
    _one_error_line(start("other", "--args", '["ana"]', "--id", "c-1"),
                    "object 'c-1' already exists and runs agent 'hello', not 'other'",
                    "another object id")
    _one_error_line(_cli(tmp_path, *common, "send", "c-1", "go\x01", "1"),
                    "event name 'go\\x01' holds a control character")
    assert [(info.object_id, info.agent) for info in reader.list()] == [("c-1", "hello")]
    assert reader.store.pending_events("c-1") == []
    assert _first(reader, "c-1")["intent"]["args"] == ["ana"]


def test_cli_refuses_a_lone_surrogate_in_an_id(store_url: str, tmp_path: Path) -> None:
    """An id holding a lone surrogate (an undecodable byte in the command line) is refused
    in one line like any other bad id, on every store."""
    (tmp_path / "agents.py").write_text(CLI_AGENTS)
    done = _cli(tmp_path, "--store", store_url, "--key-dir", str(tmp_path / "keys"), "--app",
                "agents:app", "start", "hello", "--args", '["ana"]', "--id", "lone\udcff")
    _one_error_line(done, "lone surrogate (U+DCFF")
