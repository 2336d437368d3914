"""The tool gate: whether a tool call a model proposed may run. Pure: no I/O.

Reasoning cannot authorise action. A model's tool call becomes a ``Proposal`` (tool,
arguments in canonical JSON, their SHA-256); ``decide(proposal, policy, facts)`` says
``allow``, ``deny`` (with the reason the model is told) or ``approval`` (a person must
decide; who may, and until when). The rules, in the order they are applied:

1. the tool must be registered (``facts.tool``) and the arguments must fit its schema;
2. a rule of the policy must list the tool for this agent and trust scope: a tool no
   rule lists is denied (default deny);
3. the capabilities the tool needs must be granted to the object's trust scope;
4. the tool's and the rule's argument constraints (paths, URL hosts, ranges, values);
5. caps: calls of the tool per object and per hour (``facts.calls``);
6. the budget: tokens and cost the object's model calls used (``facts.tokens_used``,
   ``facts.cost_used``, from the ledger) against the policy's limits;
7. risk: a tool at or above ``policy.approval_from`` (or a rule with ``approval=True``)
   needs a person; a rule's ``approval=False`` waives that below ``critical``.

Every decision names the policy (``policy.ref``: name and content hash) and the rule
that applied, and is recorded, so memory shows which rule let what through.
``approval_problem`` checks a person's decision against the proposal it names: the
arguments' hash must match (arguments changed after approval are refused) and the
identity must be one the decision allows. ``late_problem`` checks it against the
proposal's deadline: a decision signed after it counts for nothing (the call expires,
which counts as rejected), whenever and in whatever order a node comes to see them.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from perdure.core.codec import encode
from perdure.core.constraints import Constraint, schema_problem

__all__ = [
    "ALLOW",
    "APPROVAL",
    "DENY",
    "RISKS",
    "Allow",
    "Facts",
    "GateDecision",
    "Policy",
    "Proposal",
    "ToolInfo",
    "approval_problem",
    "args_digest",
    "canonical_args",
    "decide",
    "late_problem",
    "risk_rank",
]

ALLOW, DENY, APPROVAL = "allow", "deny", "approval"
RISKS = ("low", "medium", "high", "critical")
"""Risk levels, lowest first."""


def risk_rank(risk: str) -> int:
    """The rank of ``risk`` in ``RISKS`` (``ValueError`` for an unknown level)."""
    try:
        return RISKS.index(risk)
    except ValueError:
        raise ValueError(f"risk must be one of {RISKS}, not {risk!r}") from None


def canonical_args(args: Mapping[str, Any]) -> str:
    """The arguments as canonical JSON text (sorted keys, no spaces)."""
    return encode(dict(args), what="tool arguments").decode()


def args_digest(args_json: str, data_key: bytes | None = None) -> str:
    """The digest of canonical argument text a proposal (and a decision on it) names:
    its hex SHA-256; for arguments stored sealed, an HMAC-SHA256 under a key derived
    from the object's ``data_key`` (64 hex digits as well), so that the stored hash is
    no way to confirm a guess of the arguments for whoever lacks the key, while every
    holder of the key computes the same digest again."""
    if data_key is None:
        return hashlib.sha256(args_json.encode()).hexdigest()
    mac_key = hashlib.sha256(b"perdure:args-digest:1\x00" + data_key).digest()
    return hmac.new(mac_key, args_json.encode(), hashlib.sha256).hexdigest()


@dataclass(frozen=True, slots=True)
class ToolInfo:
    """What the gate knows of a registered tool: its name, risk level, whether it is
    idempotent, the capabilities it needs, its constraints and its argument schema."""

    name: str
    risk: str = "low"
    idempotent: bool = True
    capabilities: frozenset[str] = frozenset()
    constraints: tuple[Constraint, ...] = ()
    schema: Mapping[str, Any] = field(default_factory=lambda: {"type": "object"})


@dataclass(frozen=True, slots=True)
class Proposal:
    """A tool call a model proposed: the tool, the arguments, their canonical JSON and
    its hash, the provider's call id and the model call that produced it."""

    tool: str
    args: Mapping[str, Any]
    args_json: str
    args_hash: str
    call_id: str = ""
    model_call: str = ""

    @classmethod
    def make(cls, tool: str, args: Mapping[str, Any], *, call_id: str = "",
             model_call: str = "") -> Proposal:
        """A proposal of ``tool`` with ``args`` (canonical JSON and hash computed)."""
        text = canonical_args(args)
        return cls(tool, dict(args), text, args_digest(text), call_id, model_call)


@dataclass(frozen=True, slots=True)
class Allow:
    """One rule of a policy: it lists ``tools`` (``"*"``: every registered tool) for the
    ``agents`` and trust ``scopes`` it names (``None``: any), with extra argument
    ``constraints``, caps (``max_per_object``, ``max_per_hour``), whether a person must
    approve (``approval``: ``True`` always, ``False`` never below ``critical``, ``None``
    by the tool's risk) and who may (``approvers``: identities; ``None``: the policy's)."""

    tools: AbstractSet[str] | str
    agents: AbstractSet[str] | str | None = None
    scopes: AbstractSet[str] | str | None = None
    constraints: tuple[Constraint, ...] = ()
    max_per_object: int | None = None
    max_per_hour: int | None = None
    approval: bool | None = None
    approvers: AbstractSet[str] | str | None = None
    name: str = ""

    def __post_init__(self) -> None:
        for attr in ("tools", "agents", "scopes", "approvers"):
            value = getattr(self, attr)
            if isinstance(value, str) and (attr != "tools" or value != "*"):
                object.__setattr__(self, attr, frozenset((value,)))
            elif value is not None and not isinstance(value, str):
                object.__setattr__(self, attr, frozenset(value))

    def lists(self, tool: str, agent: str, scope: str) -> bool:
        """Whether this rule speaks for ``tool`` called by ``agent`` in ``scope``."""
        return ((self.tools == "*" or tool in self.tools)
                and (self.agents is None or agent in self.agents)
                and (self.scopes is None or scope in self.scopes))

    def to_json(self) -> dict[str, Any]:
        """The JSON form (part of the policy's content hash)."""
        def names(value: AbstractSet[str] | str | None) -> Any:
            return value if value is None or isinstance(value, str) else sorted(value)
        return {"tools": names(self.tools), "agents": names(self.agents),
                "scopes": names(self.scopes),
                "constraints": [c.to_json() for c in self.constraints],
                "max_per_object": self.max_per_object, "max_per_hour": self.max_per_hour,
                "approval": self.approval, "approvers": names(self.approvers),
                "name": self.name}


@dataclass(frozen=True, slots=True)
class Policy:
    """A named set of rules for tool calls.

    ``rules`` are tried in order and the first that lists the tool for the agent and
    scope applies; a tool none lists is denied. ``approval_from`` is the lowest risk
    that needs a person; ``approvers`` maps a risk level to the identities (node ids of
    approving clients) allowed to decide at that level and the levels above it up to the
    next one named (no level at or below: any trusted identity); ``grants`` maps a trust
    scope to the capabilities its objects' tools may use; ``max_tokens`` / ``max_cost``
    stop tool calls once the object's model calls used that much; ``approval_ttl``
    (seconds) makes a pending approval expire, after which the proposal counts as
    rejected.
    """

    name: str
    rules: tuple[Allow, ...] = ()
    approval_from: str = "high"
    approvers: Mapping[str, AbstractSet[str]] = field(default_factory=dict)
    grants: Mapping[str, AbstractSet[str]] = field(default_factory=dict)
    max_tokens: int | None = None
    max_cost: Decimal | None = None
    approval_ttl: float | None = None

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise ValueError("a policy needs a name")
        risk_rank(self.approval_from)
        object.__setattr__(self, "rules", tuple(self.rules))
        for risk in self.approvers:
            risk_rank(risk)
        object.__setattr__(self, "approvers",
                           {k: frozenset(v) for k, v in self.approvers.items()})
        object.__setattr__(self, "grants", {k: frozenset(v) for k, v in self.grants.items()})
        if self.max_cost is not None:
            object.__setattr__(self, "max_cost", Decimal(str(self.max_cost)))
        if self.approval_ttl is not None and not self.approval_ttl > 0:
            raise ValueError("approval_ttl must be a positive number of seconds")

    def to_json(self) -> dict[str, Any]:
        """The JSON form whose hash names this policy's content."""
        return {"name": self.name, "rules": [r.to_json() for r in self.rules],
                "approval_from": self.approval_from,
                "approvers": {k: sorted(v) for k, v in sorted(self.approvers.items())},
                "grants": {k: sorted(v) for k, v in sorted(self.grants.items())},
                "max_tokens": self.max_tokens,
                "max_cost": None if self.max_cost is None else str(self.max_cost),
                "approval_ttl": self.approval_ttl}

    def approvers_at(self, risk: str) -> AbstractSet[str]:
        """Who may decide at ``risk``: the identities named for it, else for the nearest
        lower level named (a list for ``high`` holds for ``critical`` too); empty: any
        trusted identity."""
        for level in reversed(RISKS[:risk_rank(risk) + 1]):
            if level in self.approvers:
                return self.approvers[level]
        return frozenset()

    @property
    def digest(self) -> str:
        """The hex SHA-256 of the policy's canonical JSON."""
        return hashlib.sha256(encode(self.to_json(), what="policy")).hexdigest()

    @property
    def ref(self) -> str:
        """``name@hash`` (16 hex digits of the content hash): what decisions record."""
        return f"{self.name}@{self.digest[:16]}"


@dataclass(frozen=True, slots=True)
class Facts:
    """What the gate decides on beside the proposal and the policy: the calling agent
    and its trust scope, the registered tool (``None``: unknown), the tool calls this
    object has let through so far (``(tool, time)``), the ledger's totals and the time."""

    agent: str
    scope: str
    tool: ToolInfo | None
    now: float
    calls: Sequence[tuple[str, float]] = ()
    tokens_used: int = 0
    cost_used: Decimal = Decimal(0)


@dataclass(frozen=True, slots=True)
class GateDecision:
    """``verdict`` (``allow``, ``deny`` or ``approval``), why, the policy's ``ref``, the
    rule that applied (its name or ``#index``; empty when none did), who may approve
    (empty: any trusted identity) and when a pending approval expires."""

    verdict: str
    reason: str
    policy: str
    rule: str = ""
    approvers: tuple[str, ...] = ()
    expires_at: float | None = None
    risk: str = "low"

    @property
    def allowed(self) -> bool:
        """Whether the call may run now."""
        return self.verdict == ALLOW


def _rule_name(rule: Allow, index: int) -> str:
    return rule.name or f"#{index}"


def decide(proposal: Proposal, policy: Policy, facts: Facts) -> GateDecision:
    """Allow, deny or ask a person about ``proposal`` under ``policy`` (see the module)."""
    ref = policy.ref
    tool = facts.tool
    if tool is None or tool.name != proposal.tool:
        return GateDecision(DENY, f"unknown tool {proposal.tool!r}: no such tool is registered",
                            ref)
    problem = schema_problem(tool.schema, dict(proposal.args))
    if problem is not None:
        return GateDecision(DENY, f"invalid arguments: {problem}", ref, risk=tool.risk)
    for index, rule in enumerate(policy.rules):
        if rule.lists(proposal.tool, facts.agent, facts.scope):
            return _under_rule(proposal, policy, facts, tool, rule, _rule_name(rule, index))
    return GateDecision(
        DENY, f"tool {proposal.tool!r} is not allowed for agent {facts.agent!r} in trust "
        f"scope {facts.scope!r} (policy {policy.name!r} lists it nowhere)", ref, risk=tool.risk)


def _under_rule(proposal: Proposal, policy: Policy, facts: Facts, tool: ToolInfo,
                rule: Allow, rule_name: str) -> GateDecision:
    ref = policy.ref

    def deny(reason: str) -> GateDecision:
        return GateDecision(DENY, reason, ref, rule_name, risk=tool.risk)

    missing = tool.capabilities - policy.grants.get(facts.scope, frozenset())
    if missing:
        return deny(f"tool {tool.name!r} needs {sorted(missing)!r}, not granted to trust "
                    f"scope {facts.scope!r}")
    for constraint in (*tool.constraints, *rule.constraints):
        problem = constraint.problem(proposal.args)
        if problem is not None:
            return deny(problem)
    done = [at for name, at in facts.calls if name == tool.name]
    if rule.max_per_object is not None and len(done) >= rule.max_per_object:
        return deny(f"tool {tool.name!r} may run at most {rule.max_per_object} time(s) per "
                    "object")
    if rule.max_per_hour is not None:
        recent = sum(1 for at in done if facts.now - at < 3600.0)
        if recent >= rule.max_per_hour:
            return deny(f"tool {tool.name!r} may run at most {rule.max_per_hour} time(s) per "
                        "hour")
    if policy.max_tokens is not None and facts.tokens_used >= policy.max_tokens:
        return deny(f"budget exhausted: {facts.tokens_used} tokens used of "
                    f"{policy.max_tokens}")
    if policy.max_cost is not None and facts.cost_used >= policy.max_cost:
        return deny(f"budget exhausted: ${facts.cost_used} spent of ${policy.max_cost}")
    rank = risk_rank(tool.risk)
    needs_person = rank >= risk_rank(policy.approval_from)
    if rule.approval is True or (needs_person and not (rule.approval is False
                                                       and tool.risk != "critical")):
        approvers = rule.approvers if rule.approvers is not None else policy.approvers_at(
            tool.risk)
        why = (f"rule {rule_name!r} asks a person" if rule.approval is True and not needs_person
               else f"tool {tool.name!r} is {tool.risk} risk")
        expires = None if policy.approval_ttl is None else facts.now + policy.approval_ttl
        return GateDecision(APPROVAL, why, ref, rule_name, tuple(sorted(approvers)), expires,
                            tool.risk)
    return GateDecision(ALLOW, f"allowed by rule {rule_name!r}", ref, rule_name,
                        risk=tool.risk)


def approval_problem(decision: GateDecision, args_hash: str, approved_hash: str,
                     identity: str) -> str | None:
    """Why a person's decision on a proposal cannot count, or ``None``: it must name the
    arguments' hash the gate decided on, and come from an allowed identity."""
    if decision.verdict != APPROVAL:
        return "the proposal does not wait for a person"
    if approved_hash != args_hash:
        return (f"the decision names arguments {approved_hash[:16]}…, the proposal's are "
                f"{args_hash[:16]}… (arguments changed after approval)")
    if decision.approvers and identity not in decision.approvers:
        return (f"identity {identity!r} may not decide on {decision.risk}-risk calls "
                f"(allowed: {', '.join(decision.approvers)})")
    return None


def late_problem(expires_at: float | None, decided_at: Any) -> str | None:
    """Why a person's decision signed at ``decided_at`` (seconds since the epoch, as
    the deciding client's clock said) cannot count on a proposal that expires at
    ``expires_at`` (``None``: never), or ``None``. Both times come from memory and the
    signed decision, never from the reading node's clock, so every node, and every replay,
    gets the same answer: a decision with no signed time cannot count against a deadline,
    one signed after it is late."""
    if expires_at is None:
        return None
    if isinstance(decided_at, bool) or not isinstance(decided_at, int | float):
        return ("the decision carries no signed time, and the proposal has a deadline: "
                "it cannot be shown to have been made in time")
    if decided_at > expires_at:
        return (f"the decision was signed {decided_at - expires_at:.1f} s after the "
                "proposal's deadline: the call expired, which counts as rejected")
    return None
