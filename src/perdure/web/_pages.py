"""The dashboard's pages as HTML: every value escaped, every word about an object and its
memory from ``perdure.describe`` (the renderer ``perdure show`` uses), so that the CLI and
the dashboard never disagree.

Regions marked ``data-live`` are refreshed in place by ``app.js``; forms are outside
them, so that a refresh never eats what someone is typing.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterable, Mapping, Sequence
from html import escape
from typing import Any
from urllib.parse import quote, urlencode

from perdure import describe as view
from perdure.core.approvals import PendingApproval, pending_in
from perdure.core.bodies import Instantiated, IntentRefined, decode
from perdure.core.chain import VerifyReport
from perdure.core.events import APPROVAL_EVENT
from perdure.core.records import Kind, Record
from perdure.core.sealing import sealed_shown
from perdure.describe import STATUS_STYLE
from perdure.errors import RecordDecodeError
from perdure.info import ObjectInfo
from perdure.schedules import ScheduleInfo
from perdure.stores.base import AlertRow, NodeInfo, QueueStats, QuotaStats
from perdure.web._actions import Question
from perdure.web._auth import Principal
from perdure.web._queries import Filters

__all__ = ["alerts_page", "approval_card", "inbox_page", "layout", "list_page", "login_page",
           "message_page", "nodes_page", "object_page", "overview_page", "queues_page",
           "schedules_page"]

_TIMELINE_SHOWN = 1000  # records of one object drawn at once (the newest)


def _e(value: object) -> str:
    return escape(str(value), quote=True)


def _oid_url(object_id: str) -> str:
    return "/objects/" + quote(object_id, safe="")


def _status(status: str) -> str:
    return f'<span class="status s-{_e(status)}">{_e(status)}</span>'


def _csrf(csrf: str) -> str:
    return f'<input type="hidden" name="csrf" value="{_e(csrf)}">'


def _nonce() -> str:
    """A form's own id: the same form sent twice delivers its event once."""
    return f'<input type="hidden" name="nonce" value="{secrets.token_urlsafe(16)}">'


def layout(title: str, body: str, *, who: Principal | None, csrf: str = "",
           active: str = "") -> str:
    """A whole page: head, navigation, who is logged in, ``body``."""
    nav = ""
    if who is not None:
        links = "".join(
            f'<a href="{href}" class="{"on" if key == active else ""}">{name}</a>'
            for key, href, name in (("overview", "/", "Overview"),
                                    ("objects", "/objects", "Objects"),
                                    ("inbox", "/inbox", "Inbox"),
                                    ("queues", "/queues", "Queues"),
                                    ("schedules", "/schedules", "Schedules"),
                                    ("nodes", "/nodes", "Nodes"),
                                    ("alerts", "/alerts", "Alerts")))
        nav = (f'<nav>{links}<span class="who">{_e(who.name)} · {_e(who.role)}</span>'
               f'<form method="post" action="/logout" class="inline">{_csrf(csrf)}'
               '<button type="submit">Log out</button></form></nav>')
    return ("<!doctype html><html lang=en><head><meta charset=utf-8>"
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{_e(title)} · perdure</title>"
            '<link rel="stylesheet" href="/static/app.css">'
            '<script src="/static/app.js" defer></script></head>'
            f'<body><header><a class="brand" href="/">perdure</a>{nav}</header>'
            f"<main>{body}</main></body></html>")


def message_page(title: str, text: str, who: Principal | None, csrf: str = "") -> str:
    """A page saying one thing (an error, a refusal)."""
    return layout(title, f'<h1>{_e(title)}</h1><p class="msg">{_e(text)}</p>'
                  '<p><a href="/">Back</a></p>', who=who, csrf=csrf)


def login_page(error: str | None, csrf: str) -> str:
    """The login form: a name (who you are, recorded with your actions) and a token or
    password."""
    err = f'<p class="error">{_e(error)}</p>' if error else ""
    body = (f'<h1>Log in</h1>{err}<form method="post" action="/login" class="login">'
            f"{_csrf(csrf)}"
            '<label>Your name <input name="name" autocomplete="username" maxlength="80" '
            'required></label>'
            '<label>Token or password <input name="secret" type="password" '
            'autocomplete="current-password" required></label>'
            '<button type="submit" id="login">Log in</button></form>'
            '<p class="hint">The token was printed once when the dashboard first started '
            "(<code>perdure ui --new-tokens</code> issues new ones).</p>")
    return layout("Log in", body, who=None)


def _flash(flash: str | None, error: str | None) -> str:
    out = ""
    if flash:
        out += f'<p class="flash">{_e(flash)}</p>'
    if error:
        out += f'<p class="error">{_e(error)}</p>'
    return out


# -- overview ------------------------------------------------------------------------------


def overview_page(counts: Mapping[str, int], hour: Mapping[str, Any], live: int, *,
                  who: Principal, csrf: str) -> str:
    """Counts by status, live nodes, and four charts of the last hour."""
    tiles = "".join(f'<div class="tile">{_status(s)}<b>{n}</b></div>'
                    for s, n in sorted(counts.items()))
    charts = "".join(
        f'<figure class="chart" data-series="{key}" data-unit="{unit}"><figcaption>{title}'
        f'</figcaption><svg viewBox="0 0 600 160" role="img" aria-label="{title}"></svg>'
        "</figure>"
        for key, title, unit in (("completed", "Completed per minute", ""),
                                 ("failed", "Failed or cancelled per minute", ""),
                                 ("wake_latency", "Wake latency (mean s)", "s"),
                                 ("spend", "Model spend per minute ($)", "$")))
    data = json.dumps(dict(hour)).replace("<", "\\u003c")
    body = (f'<h1>Overview</h1><section data-live id="overview">'
            f'<div class="tiles">{tiles}<div class="tile">nodes live<b>{live}</b></div></div>'
            f'<script type="application/json" id="hour-data">{data}</script>'
            f'<div class="charts">{charts}</div>'
            f'<p class="hint">Last hour, per minute; latency and spend from the '
            f'{int(hour.get("sampled_objects", 0))} objects updated most recently.</p>'
            "</section>")
    return layout("Overview", body, who=who, csrf=csrf, active="overview")


# -- the objects list ------------------------------------------------------------------------


def _filter_form(filters: Filters) -> str:
    chosen = filters.status or ""
    options = "".join(
        f'<option value="{s}"{" selected" if s == chosen else ""}>{s or "any"}</option>'
        for s in ("", *STATUS_STYLE))
    fields = [f'<label>status<select name="status">{options}</select></label>']
    for name, label in (("q", "id"), ("phase", "phase"),
                        ("agent", "agent"), ("version", "version"), ("label", "label k=v"),
                        ("parent", "parent"), ("node", "node"), ("since", "created since"),
                        ("until", "created until")):
        value = filters.query().get(name, "")
        hint = ' placeholder="2026-11-24 09:30"' if name in ("since", "until") else ""
        fields.append(f'<label>{label}<input name="{name}" value="{_e(value)}"{hint}>'
                      "</label>")
    return (f'<form method="get" action="/objects" class="filters">{"".join(fields)}'
            '<button type="submit">Filter</button> <a href="/objects">clear</a></form>')


def object_rows(infos: Sequence[ObjectInfo]) -> str:
    """Table rows of objects, as ``perdure ls`` lists them."""
    out = []
    for info in infos:
        cells = view.listing_row(info)
        out.append(f'<tr><td><a href="{_oid_url(info.object_id)}">{_e(cells[0])}</a></td>'
                   f"<td>{_e(cells[1])}</td><td>{_status(cells[2])}</td>"
                   + "".join(f"<td>{_e(c)}</td>" for c in cells[3:])
                   + f'<td class="note">{_e(info.note or view.waiting_for(info) or "")}</td></tr>')
    return "".join(out)


def list_page(infos: Sequence[ObjectInfo], filters: Filters, next_cursor: str | None,
              cursor: str | None, *, who: Principal, csrf: str, error: str | None = None
              ) -> str:
    """One page of objects, newest first, with the filters and the link to the next."""
    head = "".join(f"<th>{c}</th>" for c in (*view.LISTING_COLUMNS, "note"))
    more = ""
    if next_cursor:
        more = (f'<a class="next" href="/objects?'
                f'{_e(urlencode({**filters.query(), "cursor": next_cursor}))}">next page →</a>')
    first = ' <a href="/objects">first page</a>' if cursor else ""
    body = (f"<h1>Objects</h1>{_flash(None, error)}{_filter_form(filters)}"
            f'<section data-live id="objects"><table class="objects"><thead><tr>{head}</tr>'
            f"</thead><tbody>{object_rows(infos)}</tbody></table>"
            f'<p class="pager">{len(infos)} shown. {more}{first}</p></section>')
    return layout("Objects", body, who=who, csrf=csrf, active="objects")


# -- an object ---------------------------------------------------------------------------------


def _intent_section(records: Sequence[Record]) -> str:
    first = next((r for r in records if r.kind == Kind.INSTANTIATED), None)
    if first is None:
        return "<p>No intent record.</p>"
    try:
        body = decode(first)
    except RecordDecodeError as exc:
        return f'<p class="error">The intent record cannot be decoded: {_e(exc.reason)}</p>'
    assert isinstance(body, Instantiated)
    intent, ctx = body.intent, body.context
    rows = [("agent", f"{intent.agent}@{intent.version}"),
            ("arguments", json.dumps(sealed_shown(list(intent.args)), ensure_ascii=False)),
            ("keyword arguments", json.dumps(sealed_shown(intent.kwargs), ensure_ascii=False,
                                             sort_keys=True)),
            ("goal", json.dumps(sealed_shown(intent.goal), ensure_ascii=False,
                                sort_keys=True)),
            ("deadline", view.when(intent.deadline)),
            ("max failures", "policy default" if intent.max_failures is None
             else str(intent.max_failures)),
            ("requires", ", ".join(intent.requires) or "-"),
            ("budget", json.dumps(intent.budget) if intent.budget else "-")]
    refinements = []
    for rec in records:
        if rec.kind == Kind.INTENT_REFINED:
            try:
                refined = decode(rec)
            except RecordDecodeError as exc:
                refinements.append(f"<li>#{rec.seq}: cannot be decoded: {_e(exc.reason)}</li>")
                continue
            assert isinstance(refined, IntentRefined)
            refinements.append(
                f"<li>#{rec.seq} {_e(view.when(rec.ts))} v{refined.intent.version_no}: "
                f"<code>{_e(json.dumps(sealed_shown(refined.changes), sort_keys=True))}"
                f"</code></li>")
    context = [("trace", ctx.trace_id), ("parent", ctx.parent_id or "-"),
               ("root", ctx.root_id or "-"), ("depth", str(ctx.depth)),
               ("trust scope", ctx.trust_scope),
               ("labels", ", ".join(f"{k}={v}" for k, v in sorted(ctx.labels.items())) or "-")]
    table = "".join(f"<tr><th>{_e(k)}</th><td><code>{_e(view.clip(v, 2000))}</code></td></tr>"
                    for k, v in rows)
    ctable = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in context)
    refined_html = (f'<h3>Refinements</h3><ol class="refinements">{"".join(refinements)}</ol>'
                    if refinements else "")
    return (f'<div class="cols"><div><h2>Intent v{intent.version_no}</h2><table class="kv">'
            f"{table}</table>{refined_html}</div><div><h2>Context</h2>"
            f'<table class="kv">{ctable}</table></div></div>')


def _timeline(records: Sequence[Record], total: int) -> str:
    shown = records[-_TIMELINE_SHOWN:]
    skipped = max(0, total - len(shown))
    rows = "".join(_row(row, view.troubled(rec))
                   for row, rec in zip(view.timeline(shown), shown, strict=True))
    note = f'<p class="hint">{skipped} older record(s) not shown.</p>' if skipped else ""
    return (f'<h2>Memory ({total} records)</h2>{note}<table class="timeline"><thead><tr>'
            "<th>seq</th><th>time</th><th>node</th><th>kind</th><th>what</th></tr></thead>"
            f"<tbody>{rows}</tbody></table>")


def _row(row: view.TimelineRow, trouble: bool = False) -> str:
    """One record as a table row; ``trouble`` draws it in the error colour."""
    css = f"k-{row.kind}" + (" whole" if row.whole else "") + (" trouble" if trouble else "")
    return (f'<tr class="{_e(css)}"><td>{_e(row.seq)}</td><td>{_e(row.time)}</td>'
            f"<td>{_e(row.node)}</td><td>{_e(row.kind)}</td><td>{_e(row.what)}</td></tr>")


def _tree(lines: Iterable[view.TreeLine], current: str) -> str:
    out = []
    for line in lines:
        info = line.info
        me = ' class="me"' if info.object_id == current else ""
        out.append(f"<div{me}><span class=branch>{_e(line.prefix)}</span>"
                   f'<a href="{_oid_url(info.object_id)}">{_e(info.object_id)}</a> '
                   f"{_e(info.agent)}@{_e(info.agent_version)} {_status(info.status)} "
                   f"phase {_e(info.phase)}</div>")
    return f'<div class="tree">{"".join(out)}</div>'


def _rows_section(title: str, css: str, rows: Sequence[view.TimelineRow]) -> str:
    """Some of memory's records, as the timeline draws them, under ``title``."""
    if not rows:
        return ""
    body = "".join(_row(row) for row in rows)
    return (f'<h2>{_e(title)}</h2><table class="timeline {css}"><thead><tr><th>seq</th>'
            "<th>time</th><th>node</th><th>kind</th><th>what</th></tr></thead>"
            f"<tbody>{body}</tbody></table>")


def _tools_section(records: Sequence[Record]) -> str:
    """The tool calls: proposals, the gate's verdicts, who decided, how each ended."""
    return _rows_section("Tool calls", "tools", view.tool_trail(records))


def _restores_section(records: Sequence[Record]) -> str:
    """The restore reports: what came back on each reentry."""
    return _rows_section("Restores", "restores", view.restores(records))


def _ledger_section(records: Sequence[Record]) -> str:
    """The model calls with their tokens, cost and latency."""
    rows = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>"
                   for row in view.model_ledger(records))
    if not rows:
        return ""
    head = "".join(f"<th>{_e(c)}</th>" for c in ("seq", "call", "model", "attempt",
                                                  "tokens in", "tokens out", "cost",
                                                  "latency"))
    return (f'<h2>Model calls</h2><table class="timeline ledger"><thead><tr>{head}</tr>'
            f"</thead><tbody>{rows}</tbody></table>")


def _answerable(event: str | None) -> str:
    """The event a person may send to an object waiting for ``event``: itself, unless it
    is reserved to perdure (``perdure:approval`` is decided in its own forms)."""
    return "" if event is None or event.startswith("perdure:") else event


def _refused_lines(rows: Sequence[view.TimelineRow]) -> str:
    """Refused events, each with its reason, in the error colour."""
    return "".join(f'<p class="error refused">{_e(row.what)} (record #{_e(row.seq)}, '
                   f"{_e(row.time)})</p>" for row in rows)


def _refused_section(records: Sequence[Record]) -> str:
    """The events sent to the object that its workers refused: whoever sent them must
    learn their answer, decision or note did not count, and why."""
    rows = view.refused(records)
    if not rows:
        return ""
    return (f'<div id="refused"><h2>Refused events ({len(rows)})</h2><p class="hint">Sent '
            "to this object, they did not count: the workers did not accept the sender's "
            f"key. Send again with a key their roots certify.</p>{_refused_lines(rows)}</div>")


def _result_section(info: ObjectInfo, records: Sequence[Record]) -> str:
    """A completed object's result, whole (as JSON; a sealed value stays sealed)."""
    if info.status != "completed":
        return ""
    last = next((r for r in reversed(records) if r.kind == Kind.TERMINATED), None)
    if last is None or last.body.get("outcome") != "completed":
        return ""
    value = sealed_shown(last.body.get("result"))
    text = json.dumps(value, ensure_ascii=False, indent=2, sort_keys=True, default=str)
    return f'<h2>Result</h2><pre class="result" id="result">{_e(text)}</pre>'


def _controls(info: ObjectInfo, who: Principal, csrf: str, records: int) -> str:
    if not who.can_act:
        return '<p class="hint">Viewers read; an operator can act on this object.</p>'
    if info.terminal:
        base = ""
    else:
        oid = f'<input type="hidden" name="object_id" value="{_e(info.object_id)}">'
        hold = ("resume", "Resume") if info.status == "paused" else ("pause", "Pause")
        retry = (f'<form method="post" action="/act/retry">{_csrf(csrf)}{oid}'
                 '<button id="retry">Retry (parked)</button></form>'
                 if info.status == "parked" else "")
        base = (f'<form method="post" action="/act/send" class="send">{_csrf(csrf)}{oid}{_nonce()}'
                f'<label>event <input name="event" required maxlength="200" '
                f'value="{_e(_answerable(info.waiting_event))}"></label>'
                '<label>payload (JSON, or text) <input name="payload"></label>'
                '<button id="send">Send event</button></form>'
                f'<form method="post" action="/act/{hold[0]}">{_csrf(csrf)}{oid}'
                f'<button id="{hold[0]}">{hold[1]}</button></form>{retry}'
                f'<form method="post" action="/act/cancel">{_csrf(csrf)}{oid}'
                '<button id="cancel" class="danger">Cancel</button></form>')
    fork = (f'<form method="post" action="/act/fork" class="fork">{_csrf(csrf)}'
            f'<input type="hidden" name="object_id" value="{_e(info.object_id)}">'
            f'<label>fork at seq <input name="at" type="number" min="1" max="{records}" '
            f'value="{records}"></label><label>new id <input name="new_id" maxlength="200">'
            '</label><button id="fork">Fork</button></form>')
    return f'<div class="controls">{base}{fork}</div>'


def object_page(info: ObjectInfo, records: Sequence[Record], *, tree: Sequence[view.TreeLine],
                children: Sequence[ObjectInfo], usage: str | None, lineage_usage: str | None,
                report: VerifyReport | None, questions: Sequence[Question], who: Principal,
                csrf: str, flash: str | None = None,
                error: str | None = None, newest: Sequence[Record] | None = None,
                pending: Sequence[PendingApproval] | None = None) -> str:
    """Everything about one object; ``newest``: the records the timeline draws, when
    ``records`` is not the whole memory; ``pending``: its tool calls waiting for a
    person, read from memory opened with the dashboard's keys (else from ``records``)."""
    head = " ".join(
        _status(text) if style and text == str(info.status) else f"<span>{_e(text)}</span>"
        for text, style in view.headline(info))
    why = [x for x in (info.note, view.origin(info)) if x]
    if not questions and info.waiting_event != APPROVAL_EVENT and view.waiting_for(info):
        why.append(view.waiting_for(info) or "")
    if pending is None:
        pending = pending_in(records) if info.waiting_event == APPROVAL_EVENT else []
    try:
        failure = view.failure(records)
    except RecordDecodeError as exc:
        failure = f"the terminal record cannot be decoded: {exc.reason}"
    if failure and info.status in ("failed", "cancelled"):
        why.append(f"ended: {failure}")
    asks = "".join(
        f'<p class="asks"><b>Asks</b> (answer: event <code>{_e(q.event)}</code>): '
        f"{_e(view.question(q.prompt, q.choices))}</p>" if q.prompt is not None or q.choices
        else f'<p class="asks">waiting for event <code>{_e(q.event)}</code></p>'
        for q in questions)
    deciding = ""  # forms: outside the regions the page refreshes
    if pending:
        deciding = ('<div id="approvals"><p class="asks"><b>Waits for a person</b> to '
                    "decide on a tool call:</p>"
                    + "".join(approval_card(item, who, csrf, back="object")
                            for item in pending) + "</div>")
    verify = ""
    if report is not None:
        verify = (f'<p class="verify ok">verified: {report.records} records, chain and '
                  "signatures intact</p>" if report.ok else
                  f'<p class="verify bad">verify FAILED at record #{_e(report.bad_seq)}: '
                  f"{_e(report.reason)}</p>")
    kids = (f"<h2>Children ({len(children)})</h2><table class=objects><tbody>"
            f"{object_rows(children)}</tbody></table>") if children else ""
    spend = "".join(f"<p>{_e(label)}{_e(text)}</p>" for label, text in
                    (("", usage), ("lineage: ", lineage_usage)) if text)
    url = _oid_url(info.object_id)
    body = (f'<h1 class="oid">{_e(info.object_id)}</h1>{_flash(flash, error)}'
            f'<section data-live id="state"><p class="headline">{head}</p>'
            + "".join(f'<p class="why">{_e(w)}</p>' for w in why) + asks + spend
            + _refused_section(records) + "</section>" + deciding + _result_section(info, records)
            + f'<p><a href="{_e(url)}?verify=1" id="verify">Verify memory</a></p>{verify}'
            + _controls(info, who, csrf, info.records)
            + '<h2>Live stream</h2><pre id="stream" class="stream" '
            f'data-src="/stream?{_e(urlencode({"id": info.object_id}))}"></pre>'
            + _intent_section(records)
            + f'<section data-live id="lineage"><h2>Lineage</h2>{_tree(tree, info.object_id)}'
            f"{kids}</section>"
            + f'<section data-live id="calls">{_ledger_section(records)}'
            f"{_tools_section(records)}{_restores_section(records)}</section>"
            + f'<section data-live id="memory">'
            f'{_timeline(records if newest is None else newest, info.records)}</section>')
    return layout(info.object_id, body, who=who, csrf=csrf, active="objects")


# -- the inbox and the nodes ----------------------------------------------------------------


def approval_card(item: PendingApproval, who: Principal, csrf: str, *,
                  back: str = "inbox", refused: Sequence[view.TimelineRow] = ()) -> str:
    """A tool call waiting for a person: the tool, its risk, why, who may decide, its
    arguments as JSON; for an operator, the forms to approve (with edited arguments) or
    reject with a reason (``back``: ``inbox``, or ``object`` to return to its page);
    ``refused``: events sent to the object's wait that its workers refused."""
    oid, pid = item.object_id, item.proposal_id
    args = json.dumps(sealed_shown(item.arguments), ensure_ascii=False, indent=2,
                      sort_keys=True, default=str)
    acts = ""
    if who.can_act:
        hidden = (f'{_csrf(csrf)}<input type="hidden" name="object_id" value="{_e(oid)}">'
                  f'<input type="hidden" name="proposal_id" value="{_e(pid)}">'
                  f'<input type="hidden" name="back" value="{_e(back)}">')
        acts = (f'<form method="post" action="/inbox/approve">{hidden}'
                '<label>edited arguments (JSON, optional) <textarea name="edit">'
                '</textarea></label><button class="approve">Approve</button></form>'
                f'<form method="post" action="/inbox/reject">{hidden}'
                '<label>reason <input name="reason" required></label>'
                '<button class="reject danger">Reject</button></form>')
    who_may = ", ".join(item.approvers) or "any trusted identity"
    expires = ("never expires" if item.expires_at is None else
               f"expires {view.when(item.expires_at)}")
    return (f'<div class="card approval" data-object="{_e(oid)}" data-proposal="{_e(pid)}">'
            f'<p><a href="{_oid_url(oid)}">{_e(oid)}</a> wants '
            f"<b>{_e(item.tool)}</b> (risk {_e(item.risk)}), proposal {_e(pid)}, requested "
            f"{_e(view.when(item.requested_at))}, {_e(expires)}"
            f'</p><p class="hint">{_e(item.reason)} [policy {_e(item.policy)}; who may '
            f"decide: {_e(who_may)}]</p>{_refused_lines(refused)}<pre>{_e(args)}</pre>"
            f"{acts}</div>")


def _answer_inputs(choices: Sequence[Any] | None) -> str:
    """A question's answer: a button per choice when it offers choices (each sends that
    choice as JSON), else a free-text box."""
    if not choices:
        return ('<label>answer (JSON, or text) <input name="payload"></label>'
                '<button class="answer-btn">Answer</button>')
    buttons = "".join(
        f'<button class="choice" name="payload" '
        f'value="{_e(json.dumps(choice, ensure_ascii=False))}">'
        f"{_e(choice if isinstance(choice, str) else json.dumps(choice))}</button>"
        for choice in choices)
    return f'<span class="choices">{buttons}</span>'


def inbox_page(questions: Sequence[Question], approvals: Sequence[PendingApproval],
               *, who: Principal, csrf: str, flash: str | None = None,
               error: str | None = None, parked: Sequence[ObjectInfo] = (),
               damaged: Sequence[str] = (),
               refused: Mapping[str, Sequence[view.TimelineRow]] | None = None) -> str:
    """Pending approvals and questions, newest first, with their answers' forms; parked
    objects, which wait for a person too; ``damaged``: objects whose waiting approvals
    cannot be read; ``refused``: per object, the events sent to its current wait that
    its workers refused (listed with their reasons on its cards)."""
    refused = refused or {}
    parts = [f"<h1>Inbox</h1>{_flash(flash, error)}<h2>Approvals</h2>"]
    parts += [f'<p class="error">{_e(text)}</p>' for text in damaged]
    if not approvals:
        parts.append('<p class="hint">No tool call waits for approval.</p>')
    parts += [approval_card(item, who, csrf, refused=refused.get(item.object_id, ()))
              for item in approvals]
    parts.append("<h2>Questions</h2>")
    if not questions:
        parts.append('<p class="hint">No object waits for an answer.</p>')
    for q in questions:
        prompt = view.question(q.prompt, q.choices) if (q.prompt is not None or q.choices
                                                        ) else ""
        answer = ""
        if who.can_act:
            answer = (f'<form method="post" action="/act/send" '
                      f'class="answer">{_csrf(csrf)}{_nonce()}'
                      '<input type="hidden" name="object_id" '
                      f'value="{_e(q.object_id)}"><input type="hidden" name="event" '
                      f'value="{_e(q.event)}"><input type="hidden" name="back" value="inbox">'
                      f"{_answer_inputs(q.choices)}</form>")
        parts.append(
            f'<div class="card question" data-object="{_e(q.object_id)}">'
            f'<p><a href="{_oid_url(q.object_id)}">{_e(q.object_id)}</a> ({_e(q.agent)}) '
            f"waits for event <b>{_e(q.event)}</b> since {_e(view.when(q.since))}</p>"
            + (f'<p class="asks">{_e(prompt)}</p>' if prompt else "")
            + _refused_lines(refused.get(q.object_id, ())) + f"{answer}</div>")
    if parked:
        parts.append(f"<h2>Parked ({len(parked)})</h2>")
    for info in parked:
        retry = ""
        if who.can_act:
            retry = (f'<form method="post" action="/act/retry">{_csrf(csrf)}'
                     f'<input type="hidden" name="object_id" value="{_e(info.object_id)}">'
                     '<input type="hidden" name="back" value="inbox">'
                     '<button class="retry-btn">Retry</button></form>')
        parts.append(f'<div class="card parked"><p><a href="{_oid_url(info.object_id)}">'
                     f"{_e(info.object_id)}</a> ({_e(info.agent)}@{_e(info.agent_version)}) "
                     f"parked: {_e(info.note or '')}</p>{retry}</div>")
    return layout("Inbox", "".join(parts), who=who, csrf=csrf, active="inbox")


def _alert_rows(alerts: Sequence[AlertRow], resolved: bool) -> str:
    rows = []
    for row in alerts:
        subject = (f'<a href="{_oid_url(row.subject)}">{_e(row.subject)}</a>'
                   if row.subject not in ("nodes", "objects") and "/" not in row.subject
                   else _e(row.subject))
        ended = f"<td>{_e(view.when(row.resolved_at))}</td>" if resolved else ""
        rows.append(f"<tr><td>{_e(row.rule)}</td><td>{subject}</td><td>{_e(row.summary)}</td>"
                    f"<td>{_e(view.when(row.fired_at))}</td>{ended}"
                    f"<td>{_e(row.node_id)}</td></tr>")
    head = ("<th>rule</th><th>subject</th><th>summary</th><th>fired</th>"
            + ("<th>resolved</th>" if resolved else "") + "<th>by node</th>")
    return (f'<table class="alerts"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table>')


def alerts_page(firing: Sequence[AlertRow], resolved: Sequence[AlertRow], *,
                who: Principal, csrf: str) -> str:
    """Alerts the nodes fired (``perdure.telemetry.Alerts``): those firing now, and the
    latest resolved (read-only)."""
    parts = [f"<h1>Alerts</h1><h2>Firing ({len(firing)})</h2>"]
    parts.append(_alert_rows(firing, False) if firing
                 else '<p class="hint">No alert is firing.</p>')
    parts.append("<h2>Recently resolved</h2>")
    parts.append(_alert_rows(resolved, True) if resolved
                 else '<p class="hint">No alert resolved yet.</p>')
    return layout("Alerts", "".join(parts), who=who, csrf=csrf, active="alerts")


def nodes_page(nodes: Sequence[NodeInfo], running: Mapping[str, Sequence[str]], now: float,
               *, who: Principal, csrf: str) -> str:
    """Live nodes: what they serve, their capabilities, last heartbeat, what they run."""
    rows = []
    for node in nodes:
        runs = running.get(node.node_id, ())
        shown = ", ".join(f'<a href="{_oid_url(o)}">{_e(o)}</a>' for o in runs[:20])
        more = f" and {len(runs) - 20} more" if len(runs) > 20 else ""
        rows.append(f"<tr><td>{_e(node.node_id)}</td><td>{_e(', '.join(node.serves))}</td>"
                    f"<td>{_e(', '.join(node.capabilities) or '-')}</td>"
                    f"<td>{now - node.seen_at:.1f}s ago</td><td>{len(runs)}</td>"
                    f"<td>{shown}{more}</td></tr>")
    body = ('<h1>Nodes</h1><section data-live id="nodes"><table class="nodes"><thead><tr>'
            "<th>node</th><th>serves</th><th>capabilities</th><th>heartbeat</th>"
            f'<th>running</th><th>objects</th></tr></thead><tbody>{"".join(rows)}</tbody>'
            f"</table><p>{len(nodes)} live node(s).</p></section>")
    return layout("Nodes", body, who=who, csrf=csrf, active="nodes")


# -- queues and schedules ---------------------------------------------------------------


def _limit(value: object) -> str:
    return "-" if value is None else str(value)


def _holders(held: Sequence[tuple[str | None, int]], shown: int) -> str:
    """The keys holding the most slots, ``key: n``; objects without a key as "(no key)"."""
    if not held:
        return "-"
    out = ", ".join(f"<code>{_e(key)}</code>: {n}" if key is not None else f"(no key): {n}"
                    for key, n in held[:shown])
    return out + (" …" if len(held) > shown else "")


def _quotas(quotas: Sequence[QuotaStats], now: float) -> str:
    """The model quotas and their windows (as ``perdure quotas`` lists them)."""
    if not quotas:
        return ('<h2>Model quotas</h2><p class="hint">No model quota is declared in this '
                "store (app.model_quota declares one).</p>")
    rows = []
    for item in quotas:
        q, state = item.quota, item.state
        tokens = ("-" if q.tokens_per_minute is None
                  else f"{item.used + item.reserved} of {q.tokens_per_minute} per minute "
                       f"({item.used} used, {item.reserved} reserved)")
        requests = ("-" if q.requests_per_minute is None
                    else f"{item.requests} of {q.requests_per_minute} per minute")
        blocked = state.blocked_until
        throttled = (f"{state.throttles} (no call before {blocked - now:.0f}s from now)"
                     if blocked is not None and blocked > now else str(state.throttles))
        rows.append(
            f'<tr data-quota="{_e(q.provider)}/{_e(q.model)}"><td>{_e(q.provider)}</td>'
            f"<td>{_e(q.model)}</td><td>{_e(tokens)}</td><td>{_e(requests)}</td>"
            f"<td>{item.factor:.0%}</td><td>{_e(throttled)}</td></tr>")
    head = "".join(f"<th>{c}</th>" for c in (
        "provider", "model", "tokens in the window", "requests in the window",
        "rate in force", "429s"))
    return (f'<h2>Model quotas</h2><table class="quotas"><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(rows)}</tbody></table>"
            '<p class="hint">Calls reserve an estimate before they go out and settle to '
            "what the provider reported; a 429 lowers the rate in force, which grows back "
            "window by window.</p>")


def queues_page(stats: Sequence[QueueStats],
                holders: Mapping[str, Sequence[tuple[str | None, int]]], *,
                who: Principal, csrf: str, shown: int = 5,
                quotas: Sequence[QuotaStats] = (), now: float = 0.0) -> str:
    """Every declared queue: its limits, slots held of its cap, the keys holding the most
    slots (``holders``: per queue, up to ``shown`` + 1 of them), its objects ready for a
    slot and its dormant ones (as ``perdure queues`` lists them); then every model quota
    and its window at ``now`` (as ``perdure quotas`` does). Read-only."""
    rows = []
    for item in stats:
        q = item.queue
        cap = f"{item.held} / {_limit(q.concurrency)}" if q.concurrency else str(item.held)
        limiter = ("-" if q.rate_limit is None
                   else f"{q.rate_limit} per {q.rate_period:g}s ({item.started} in it now)")
        rows.append(
            f'<tr data-queue="{_e(q.name)}"><td>{_e(q.name)}</td><td>{_e(cap)}</td>'
            f"<td>{_e(_limit(q.per_key))}</td><td>{_e(_limit(q.worker_concurrency))}</td>"
            f"<td>{_e(limiter)}</td><td>{'yes' if q.priority else 'no'}</td>"
            f'<td class="holders">{_holders(holders.get(q.name, ()), shown)}</td>'
            f"<td>{item.ready}</td><td>{item.waiting}</td></tr>")
    head = "".join(f"<th>{c}</th>" for c in (
        "queue", "held / cap", "per key", "per worker", "limiter", "priority",
        "top keys holding", "ready", "dormant"))
    empty = ('<p class="hint">No queue is declared in this store (app.queue declares one; '
             "a worker or a start on it puts it here).</p>") if not stats else ""
    body = (f'<h1>Queues</h1><section data-live id="queues">{empty}<table class="queues">'
            f"<thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
            '<p class="hint">A slot is an object of the queue a worker holds now; ready '
            "objects wait for a slot or a worker; dormant ones (sleeping, waiting for an "
            "event) hold none.</p>" + _quotas(quotas, now) + "</section>")
    return layout("Queues", body, who=who, csrf=csrf, active="queues")


def _schedule_controls(info: ScheduleInfo, who: Principal, csrf: str) -> str:
    """An operator's forms for one schedule: pause or resume, trigger now, delete (with
    a box to tick first); none for a deleted schedule or a viewer."""
    if not who.can_act or info.state == "deleted":
        return ""
    name = f'<input type="hidden" name="name" value="{_e(info.name)}">'

    def form(action: str, label: str, extra: str = "", css: str = "") -> str:
        cls = f' class="{css}"' if css else ""
        return (f'<form method="post" action="/schedules/{action}" class="inline">'
                f'{_csrf(csrf)}{name}{extra}<button data-action="{action}"{cls}>{label}'
                "</button></form>")

    hold = form("resume", "Resume") if info.state == "paused" else form("pause", "Pause")
    confirm = ('<label class="confirm"><input type="checkbox" name="confirm" value="yes" '
               "required> sure</label>")
    return (f'<div class="controls">{hold}{form("trigger", "Trigger now")}'
            f'{form("delete", "Delete", confirm, "danger")}</div>')


def schedules_page(infos: Sequence[ScheduleInfo],
                   runs: Mapping[str, Sequence[ObjectInfo]], *, who: Principal, csrf: str,
                   flash: str | None = None, error: str | None = None) -> str:
    """Every schedule: its spec, state, next and last fire, counts, and its most recent
    runs (``runs``: per schedule name) linked to their pages; an operator's controls."""
    cards = []
    for info in infos:
        spec = info.spec
        recent = runs.get(info.name, ())
        run_list = "".join(
            f'<li><a href="{_oid_url(r.object_id)}">{_e(r.object_id)}</a> '
            f"{_status(str(r.status))}</li>" for r in recent) or "<li>none yet</li>"
        facts = [("spec", f"{spec.every}, agent {spec.agent}"),
                 ("overlap", spec.overlap),
                 ("catch-up window", "-" if spec.catch_up_window is None
                  else f"{spec.catch_up_window:g}s"),
                 ("jitter", f"{spec.jitter:g}s"),
                 ("next fire", view.when(info.next_fire) if info.state == "active" else "-"),
                 ("last fire", view.when(info.last_fire)),
                 ("runs", f"{info.started} started, {info.skipped} skipped, "
                  f"{info.dropped} dropped"),
                 ("object", info.object_id)]
        table = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in facts)
        cards.append(
            f'<div class="card schedule" data-schedule="{_e(info.name)}">'
            f'<h2>{_e(info.name)} <span class="state state-{_e(info.state)}">'
            f"{_e(info.state)}</span></h2>"
            f'<table class="kv">{table}</table><p>Recent runs:</p>'
            f'<ul class="runs">{run_list}</ul>{_schedule_controls(info, who, csrf)}</div>')
    empty = ('<p class="hint">No schedule in this store (app.schedule creates one; '
             "<code>perdure schedules create</code> too).</p>") if not infos else ""
    viewer = ("" if who.can_act or not infos else
              '<p class="hint">Viewers read; an operator can pause, resume, trigger or '
              "delete a schedule.</p>")
    body = (f"<h1>Schedules</h1>{_flash(flash, error)}{viewer}"
            f'<section data-live id="schedules">{empty}{"".join(cards)}</section>')
    return layout("Schedules", body, who=who, csrf=csrf, active="schedules")
