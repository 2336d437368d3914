"""The tool gate, pure: every rule, default deny, edits re-evaluated, and decisions that
name arguments other than the proposal's refused."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from perdure.core.constraints import OneOf, PathPrefix, Range, UrlHost, schema_problem
from perdure.core.gate import (
    Allow,
    Facts,
    Policy,
    Proposal,
    ToolInfo,
    approval_problem,
    decide,
    late_problem,
)

SCHEMA = {"type": "object", "properties": {"path": {"type": "string"},
                                           "count": {"type": "integer"}},
          "required": ["path"], "additionalProperties": False}
READ = ToolInfo("read", "low", schema=SCHEMA)
SEND = ToolInfo("send", "high", idempotent=False,
                schema={"type": "object", "properties": {"to": {"type": "string"}}})
NET = ToolInfo("fetch", "medium", capabilities=frozenset({"net"}),
               schema={"type": "object", "properties": {"url": {"type": "string"}}})
NOW = 1_000_000.0


def facts(tool: ToolInfo | None, **kw: Any) -> Facts:
    kw.setdefault("agent", "planner")
    kw.setdefault("scope", "default")
    return Facts(tool=tool, now=NOW, **kw)


def policy(*rules: Allow, **kw: Any) -> Policy:
    return Policy("p", rules=rules, **kw)


def read(path: str = "/data/a", **more: Any) -> Proposal:
    return Proposal.make("read", {"path": path, **more}, call_id="c1", model_call="3")


def test_an_unregistered_tool_is_denied() -> None:
    got = decide(Proposal.make("rm", {}), policy(Allow("*")), facts(None))
    assert got.verdict == "deny" and "unknown tool 'rm'" in got.reason


def test_a_tool_no_rule_lists_is_denied_by_default() -> None:
    got = decide(read(), policy(Allow({"send"})), facts(READ))
    assert got.verdict == "deny" and "lists it nowhere" in got.reason
    assert decide(read(), policy(), facts(READ)).verdict == "deny"


def test_a_listed_low_risk_tool_is_allowed_with_the_policy_and_rule_named() -> None:
    pol = policy(Allow({"read"}, name="reads"))
    got = decide(read(), pol, facts(READ))
    assert got.allowed and got.rule == "reads" and got.policy == pol.ref
    assert pol.ref.startswith("p@") and len(pol.ref) == 2 + 16


def test_rules_are_per_agent_and_per_trust_scope() -> None:
    pol = policy(Allow({"read"}, agents={"planner"}, scopes={"internal"}))
    assert decide(read(), pol, facts(READ, scope="internal")).allowed
    assert decide(read(), pol, facts(READ, scope="default")).verdict == "deny"
    assert decide(read(), pol, facts(READ, agent="other", scope="internal")).verdict == "deny"


def test_the_first_rule_that_lists_the_tool_applies() -> None:
    pol = policy(Allow({"read"}, name="ask", approval=True), Allow("*", name="any"))
    got = decide(read(), pol, facts(READ))
    assert got.verdict == "approval" and got.rule == "ask"


@pytest.mark.parametrize("args, problem", [
    ({}, "lacks the required key 'path'"),
    ({"path": 3}, "must be of type string"),
    ({"path": "/a", "extra": 1}, "unknown key 'extra'"),
    ({"path": "/a", "count": True}, "must be of type integer"),
    ({"path": "/a", "count": 1.5}, "must be of type integer"),
])
def test_arguments_must_fit_the_tool_schema(args: dict[str, Any], problem: str) -> None:
    got = decide(Proposal.make("read", args), policy(Allow("*")), facts(READ))
    assert got.verdict == "deny" and problem in got.reason


@pytest.mark.parametrize("path, ok", [
    ("/data/a", True), ("/data", True), ("/data/../etc/passwd", False), ("/database", False),
    ("/data/./x/../y", True), ("relative", False),
])
def test_path_prefix(path: str, ok: bool) -> None:
    pol = policy(Allow("*", constraints=(PathPrefix("path", ("/data",)),)))
    assert decide(read(path), pol, facts(READ)).allowed is ok


@pytest.mark.parametrize("url, ok", [
    ("https://api.example.com/x", True), ("https://example.com", True),
    ("https://evil.com/?https://example.com", False), ("ftp://example.com", False),
    ("https://example.com.evil.com", False), ("https://user@evilexample.com", False),
    ("not a url", False),
])
def test_url_host(url: str, ok: bool) -> None:
    pol = policy(Allow("*", constraints=(UrlHost("url", (".example.com",)),)),
                 grants={"default": frozenset({"net"})})
    got = decide(Proposal.make("fetch", {"url": url}), pol, facts(NET))
    assert got.allowed is ok, got.reason


def test_range_and_one_of() -> None:
    pol = policy(Allow("*", constraints=(Range("count", 1, 10),)))
    assert decide(read(count=5), pol, facts(READ)).allowed
    assert "above 10" in decide(read(count=11), pol, facts(READ)).reason
    assert "below 1" in decide(read(count=0), pol, facts(READ)).reason
    pol = policy(Allow("*", constraints=(OneOf("path", ("/a", "/b")),)))
    assert decide(read("/a"), pol, facts(READ)).allowed
    assert decide(read("/c"), pol, facts(READ)).verdict == "deny"


def test_tool_constraints_apply_whatever_the_rule() -> None:
    tool = ToolInfo("read", "low", constraints=(PathPrefix("path", ("/safe",)),), schema=SCHEMA)
    assert decide(read("/data/a"), policy(Allow("*")), facts(tool)).verdict == "deny"


def test_capabilities_must_be_granted_to_the_trust_scope() -> None:
    call = Proposal.make("fetch", {"url": "https://x.org"})
    got = decide(call, policy(Allow("*")), facts(NET))
    assert got.verdict == "deny" and "needs ['net']" in got.reason
    pol = policy(Allow("*"), grants={"default": frozenset({"net"})})
    assert decide(call, pol, facts(NET)).allowed
    assert decide(call, pol, facts(NET, scope="untrusted")).verdict == "deny"


def test_caps_per_object_and_per_hour() -> None:
    pol = policy(Allow("*", max_per_object=2))
    assert decide(read(), pol, facts(READ, calls=[("read", 1.0)])).allowed
    got = decide(read(), pol, facts(READ, calls=[("read", 1.0), ("read", 2.0)]))
    assert got.verdict == "deny" and "at most 2" in got.reason
    pol = policy(Allow("*", max_per_hour=1))
    assert decide(read(), pol, facts(READ, calls=[("read", NOW - 3601)])).allowed
    assert decide(read(), pol, facts(READ, calls=[("read", NOW - 60)])).verdict == "deny"
    assert decide(read(), pol, facts(READ, calls=[("other", NOW - 60)])).allowed


def test_budget_from_the_ledger() -> None:
    pol = policy(Allow("*"), max_tokens=1000, max_cost=Decimal("0.50"))
    assert decide(read(), pol, facts(READ, tokens_used=999)).allowed
    got = decide(read(), pol, facts(READ, tokens_used=1000))
    assert got.verdict == "deny" and got.reason.startswith("budget exhausted")
    assert decide(read(), pol, facts(READ, cost_used=Decimal("0.5"))).verdict == "deny"


def test_risk_levels_require_a_person() -> None:
    call = Proposal.make("send", {"to": "bob"})
    got = decide(call, policy(Allow("*")), facts(SEND))
    assert got.verdict == "approval" and got.risk == "high" and got.approvers == ()
    assert decide(call, policy(Allow("*"), approval_from="critical"), facts(SEND)).allowed
    assert decide(read(), policy(Allow("*"), approval_from="low"),
                  facts(READ)).verdict == "approval"


def test_a_rule_may_waive_a_person_below_critical_only() -> None:
    call = Proposal.make("send", {"to": "bob"})
    assert decide(call, policy(Allow("*", approval=False)), facts(SEND)).allowed
    critical = ToolInfo("send", "critical", schema=SEND.schema)
    assert decide(call, policy(Allow("*", approval=False)),
                  facts(critical)).verdict == "approval"


def test_approvers_per_risk_level_and_expiry() -> None:
    pol = policy(Allow("*"), approvers={"high": frozenset({"alice"})}, approval_ttl=60)
    got = decide(Proposal.make("send", {"to": "bob"}), pol, facts(SEND))
    assert got.approvers == ("alice",) and got.expires_at == NOW + 60
    pol = policy(Allow("*", approvers={"carol"}), approvers={"high": frozenset({"alice"})})
    assert decide(Proposal.make("send", {}), pol, facts(SEND)).approvers == ("carol",)


def test_approvers_named_for_a_level_hold_for_the_levels_above() -> None:
    """A list for ``high`` binds ``critical`` calls too, never loosens to anyone."""
    pol = policy(Allow("*"), approvers={"medium": {"ops"}, "high": {"alice"}},
                 approval_from="medium")
    critical = ToolInfo("send", "critical", schema=SEND.schema)
    medium = ToolInfo("send", "medium", schema=SEND.schema)
    assert decide(Proposal.make("send", {}), pol, facts(critical)).approvers == ("alice",)
    assert decide(Proposal.make("send", {}), pol, facts(medium)).approvers == ("ops",)
    assert pol.approvers_at("low") == frozenset()


def test_a_decision_must_name_the_proposals_hash_and_an_allowed_identity() -> None:
    pol = policy(Allow("*"), approvers={"high": frozenset({"alice"})})
    call = Proposal.make("send", {"to": "bob"})
    got = decide(call, pol, facts(SEND))
    assert approval_problem(got, call.args_hash, call.args_hash, "alice") is None
    changed = Proposal.make("send", {"to": "mallory"})
    problem = approval_problem(got, changed.args_hash, call.args_hash, "alice")
    assert problem is not None and "arguments changed after approval" in problem
    assert "may not decide" in str(approval_problem(got, call.args_hash, call.args_hash,
                                                      "eve"))
    allowed = decide(read(), pol, facts(READ))
    assert approval_problem(allowed, read().args_hash, read().args_hash, "alice") is not None


def test_an_edit_is_decided_again_as_a_new_proposal() -> None:
    """An edit to a path outside the allowed prefix is denied though the original was
    allowed: the gate sees the edited arguments, not the approval."""
    pol = policy(Allow("*", constraints=(PathPrefix("path", ("/data",)),)))
    assert decide(read("/data/a"), pol, facts(READ)).allowed
    edited = Proposal.make("read", {"path": "/etc/shadow"})
    assert decide(edited, pol, facts(READ)).verdict == "deny"
    assert edited.args_hash != read("/data/a").args_hash


def test_canonical_arguments_and_hash_ignore_key_order() -> None:
    a = Proposal.make("read", {"path": "/x", "count": 1})
    b = Proposal.make("read", {"count": 1, "path": "/x"})
    assert a.args_json == b.args_json == '{"count":1,"path":"/x"}'
    assert a.args_hash == b.args_hash


def test_the_policy_hash_changes_with_its_content() -> None:
    one = policy(Allow({"read"}))
    assert one.ref == policy(Allow({"read"})).ref
    assert one.ref != policy(Allow({"read"}, max_per_object=1)).ref
    with pytest.raises(ValueError):
        Policy("", ())
    with pytest.raises(ValueError):
        Policy("x", (), approval_from="extreme")


def test_schema_problem_nested() -> None:
    schema = {"type": "object", "properties": {"xs": {"type": "array",
                                                      "items": {"type": "number"}}}}
    assert schema_problem(schema, {"xs": [1, 2.5]}) is None
    assert "xs[1]" in str(schema_problem(schema, {"xs": [1, "a"]}))
    assert schema_problem(schema, {"xs": [float("nan")]}) is not None


def test_a_decision_counts_only_if_signed_by_the_deadline() -> None:
    """``late_problem`` compares the decision's signed time with the recorded deadline:
    no reading node's clock enters, so every node and every replay agree."""
    assert late_problem(None, None) is None  # no deadline: any decision may count
    assert late_problem(None, 10**12) is None
    assert late_problem(100.0, 99.5) is None
    assert late_problem(100.0, 100.0) is None  # at the deadline: in time
    assert "after the proposal's deadline" in str(late_problem(100.0, 100.25))
    for unsigned in (None, "99", True, [99]):
        assert "no signed time" in str(late_problem(100.0, unsigned))
