"""``perdure.describe`` puts every record kind into words, explains why an object failed
or waits, and draws lineage trees; an undecodable body is said to be one."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from perdure import describe as view
from perdure.core.bodies import RecordBody, StepDone, Terminated
from perdure.core.codec import decode, encode
from perdure.core.lifecycle import Status
from perdure.core.records import Record
from perdure.info import ObjectInfo
from perdure.stores.base import NodeInfo
from tests.unit.test_bodies import CASES

TS_US = 1_700_000_000_000_000


def _record(kind: str, body: Any, seq: int = 3, node: str = "node-a") -> Record:
    data = encode(body)
    return Record("o-1", seq, "t", TS_US, node, "p", kind, data, "0" * 64, "0" * 64, b"",
                  decode(data))


def _stored(typed: RecordBody, seq: int = 3) -> Record:
    return _record(str(typed.kind), typed.encode(), seq)


def _info(object_id: str = "o-1", status: Status = Status.READY, **changes: Any) -> ObjectInfo:
    base: dict[str, Any] = dict(
        object_id=object_id, agent="review", agent_version="1", status=status,
        phase="dormancy", epoch=2, lease_owner=None, ready_at=None, waiting_event=None,
        records=5, note=None, parent_id=None, created_at=TS_US / 1e6, updated_at=TS_US / 1e6)
    return ObjectInfo(**{**base, **changes})


@pytest.mark.parametrize("typed", [typed for typed, _ in CASES],
                         ids=[f"{t.kind}-{i}" for i, (t, _) in enumerate(CASES)])
def test_every_kind_renders(typed: RecordBody) -> None:
    """Each kind of record has a line in ``show``'s timeline and in the demo's story."""
    rec = _stored(typed)
    line = view.describe(rec)
    assert line.text and "cannot be decoded" not in line.text
    told = view.Narrator().what(rec)
    assert told and "cannot be decoded" not in told
    row = view.timeline([rec])[0]
    assert (row.seq, row.node, row.kind, row.what) == ("3", "node-a", str(typed.kind),
                                                        line.text)


def test_record_lines_say_what_show_prints() -> None:
    """A sample of lines, word for word as ``perdure show`` prints them."""
    done = _stored(StepDone(4, "fetch", 1, 0.00123, {"b": 2, "a": 1}))
    assert view.describe(done) == ("#4 fetch attempt 1 -> {\"a\": 1, \"b\": 2} (0.0012s)",
                                   False)
    failed = _stored(Terminated.failed("agent raised",
                                       {"type": "builtins:ValueError", "message": "bad"}))
    assert view.describe(failed) == ("failed: ValueError: bad", True)
    cancelled = _stored(Terminated.cancelled("cancelled"))
    assert view.describe(cancelled) == ("cancelled: cancelled", True)
    value = _record("value", {"pos": 2, "cmd": "now", "value": 1.5})
    assert view.describe(value) == ('{"cmd": "now", "pos": 2, "value": 1.5}', False)


def test_an_undecodable_body_is_said_to_be_one() -> None:
    """A body its kind never writes is described as undecodable, with the reason."""
    rec = _record("step_done", {"pos": 1, "cmd": "step"})
    line = view.describe(rec)
    assert line.whole and line.text.startswith("cannot be decoded: step_done body: no ")
    assert "cannot be decoded" in view.Narrator().what(rec)


def test_failure_says_why_from_the_last_terminal_record() -> None:
    """``Type: message`` from the error, the reason without one, ``None`` without an end."""
    error = {"type": "mod:Boom", "message": "it broke"}
    assert view.failure([_stored(Terminated.failed("agent raised", error))]) == "Boom: it broke"
    assert view.failure([_stored(Terminated.failed("r", {"type": "mod:Boom"}))]) == "Boom"
    assert view.failure([_stored(Terminated.cancelled("cancelled by a person"))]) == (
        "cancelled by a person")
    assert view.failure([_stored(StepDone(0, "s", 1, 0.1, 1))]) is None


def test_waiting_note_names_what_no_live_node_has() -> None:
    """A ready object waits when no live node serves its agent version, or none that does
    has the capabilities it requires; otherwise there is nothing to explain."""
    ready = _info(requires=("gpu",))
    assert view.waiting_note(ready, []) == "waiting: no live node serves review@1"
    cpu = NodeInfo("n1", ("review@1",), (), 0.0, 60.0)
    gpu = NodeInfo("n2", ("review@1",), ("gpu",), 0.0, 60.0)
    assert view.waiting_note(ready, [cpu]) == (
        "waiting: no live node serving review@1 has gpu")
    assert view.waiting_note(ready, [cpu, gpu]) is None
    assert view.waiting_note(_info(status=Status.DORMANT), []) is None
    assert view.waiting_note(_info(note="parked: x"), []) is None


def test_waiting_for_names_the_event() -> None:
    """A dormant object asks for an event by name."""
    assert view.waiting_for(_info(waiting_event="approval")) == "waiting for event 'approval'"
    assert view.waiting_for(_info()) is None


def test_lineage_draws_descendants_depth_first() -> None:
    """Children hang under their parent with ``├──``/``└──``; deeper ones are indented
    with ``│`` where a sibling follows."""
    family = {"r": ["a", "b"], "a": ["a1", "a2"], "b": ["b1"]}
    infos = {oid: _info(oid) for oid in ("r", "a", "b", "a1", "a2", "b1")}
    lines = view.lineage(infos["r"], lambda oid: [infos[k] for k in family.get(oid, [])])
    assert [(line.prefix, line.info.object_id) for line in lines] == [
        ("", "r"), ("├── ", "a"), ("│   ├── ", "a1"), ("│   └── ", "a2"), ("└── ", "b"),
        ("    └── ", "b1")]


def test_one_line_forms_of_an_object() -> None:
    """``tree``'s line, ``show``'s headline and ``ls``'s row hold the same facts."""
    info = _info(status=Status.FAILED)
    parts = view.object_parts(info)
    assert "".join(text for text, _ in parts) == "o-1  review@1  failed  phase dormancy"
    assert ("failed", "red") in parts
    assert [text for text, _ in view.headline(info)][:3] == ["o-1", "review@1", "failed"]
    row = view.listing_row(info)
    assert len(row) == len(view.LISTING_COLUMNS) and row[:4] == ("o-1", "review@1", "failed",
                                                                "dormancy")


def test_a_narrator_subclass_tells_values_in_its_own_words() -> None:
    """Overriding ``who``, ``result``, ``progress`` and ``outcome`` changes only those."""

    class Shop(view.Narrator):
        def who(self, record: Record) -> str:
            return "till"

        def result(self, value: Any) -> str:
            return f"{value} items"

        def outcome(self, result: Any) -> str | None:
            return None

    done = _stored(StepDone(0, "count", 1, 0.1, 3))
    assert Shop().what(done) == "step done  count  (3 items)"
    assert Shop().who(done) == "till" and view.Narrator().who(done) == "node-a"
    end = _stored(Terminated.completed({"total": 3}))
    assert view.Narrator().what(end) == "terminated completed: total=3"
    assert Shop().what(end) == "terminated completed"


def test_the_ledger_tool_trail_and_restores_pick_their_records() -> None:
    """``model_ledger`` has a row per model call (tokens, exact cost, or ``-`` unpriced),
    ``tool_trail`` and ``restores`` the timeline rows of their kinds only; a model call
    whose body cannot be decoded says so in its row."""
    records = [_stored(typed, seq) for seq, (typed, _) in enumerate(CASES, 1)]
    calls = [r for r in records if r.kind == "model_call"]
    ledger = view.model_ledger(records)
    assert [row.seq for row in ledger] == [str(r.seq) for r in calls] and ledger
    for row, rec in zip(ledger, calls, strict=True):
        cost = rec.body.get("cost")
        assert row.cost == ("-" if cost is None else f"${view._dollars(Decimal(cost))}")
        assert row.input_tokens.split()[0].isdigit() and row.output_tokens.isdigit()
    tools = {"tool_proposed", "tool_gated", "tool_decided", "tool_started", "tool_result"}
    assert {row.kind for row in view.tool_trail(records)} == tools
    assert {row.kind for row in view.restores(records)} == {"restore_report"}
    broken = _record("model_call", {"pos": 1}, seq=9)
    [row] = view.model_ledger([broken])
    assert row.seq == "9" and row.call.startswith("cannot be decoded")
