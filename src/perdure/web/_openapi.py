"""The HTTP API's OpenAPI 3.1 document, built here and served at
``/api/v1/openapi.json``; ``docs/reference/openapi.json`` is the same document checked in
(``perdure api --write-openapi FILE`` writes it; a test holds the two equal).

Each request and response schema is closed (``additionalProperties: false``): a client
generated from it, or a test validating against it, sees any field the API adds or
drops.
"""

from __future__ import annotations

import json
from typing import Any

from perdure.core.lifecycle import Status

__all__ = ["API_VERSION", "PREFIX", "document", "document_text"]

PREFIX = "/api/v1"
API_VERSION = "1.0.0"

_ANY: dict[str, Any] = {"description": "any JSON value"}
_NUMBER_OR_NULL = {"type": ["number", "null"]}
_STRING_OR_NULL = {"type": ["string", "null"]}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _closed(properties: dict[str, Any], required: list[str] | None = None,
            description: str = "") -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": properties,
                              "required": sorted(required if required is not None
                                                 else properties),
                              "additionalProperties": False}
    if description:
        schema["description"] = description
    return schema


def _schemas() -> dict[str, Any]:
    statuses = [s.value for s in Status]
    question = _closed({
        "object_id": {"type": "string"},
        "agent": {"type": "string"},
        "event": {"type": "string", "description": "the event that answers it"},
        "prompt": _ANY,
        "choices": {"type": ["array", "null"], "description": "the answers offered (null: "
                    "any)"},
        "seq": {"type": "integer", "description": "the record that asked it"},
        "pos": {"type": ["integer", "string"]},
        "asked_at": {"type": "number", "description": "seconds since the epoch"},
        "timeout_at": _NUMBER_OR_NULL,
    }, description="A question a waiting object asks (run.wait_for(event, prompt=..., "
                   "choices=...)).")
    obj = _closed({
        "object_id": {"type": "string"},
        "agent": {"type": "string"},
        "agent_version": {"type": "string"},
        "status": {"type": "string", "enum": statuses},
        "phase": {"type": "string"},
        "epoch": {"type": "integer"},
        "lease_owner": _STRING_OR_NULL,
        "ready_at": _NUMBER_OR_NULL,
        "waiting_event": _STRING_OR_NULL,
        "records": {"type": "integer", "description": "records in its memory"},
        "note": _STRING_OR_NULL,
        "parent_id": _STRING_OR_NULL,
        "created_at": {"type": "number"},
        "updated_at": {"type": "number"},
        "requires": {"type": "array", "items": {"type": "string"}},
        "asking": {"type": "array", "items": _ref("Question")},
        "forked_from": {"type": ["object", "null"]},
        "avoid": {"type": "array", "items": {"type": "string"}},
        "terminal": {"type": "boolean", "description": "completed, failed or cancelled"},
    }, description="What the store says about an object now (times in seconds since the "
                   "epoch). A listed object's asking and forked_from are left empty.")
    approval = _closed({
        "object_id": {"type": "string"},
        "proposal_id": {"type": "string"},
        "args_hash": {"type": "string"},
        "tool": {"type": "string"},
        "arguments": _ANY,
        "risk": {"type": "string"},
        "approvers": {"type": "array", "items": {"type": "string"},
                      "description": "identities that may decide (empty: any trusted one)"},
        "reason": {"type": "string", "description": "why it needs a person"},
        "policy": {"type": "string"},
        "requested_at": {"type": "number"},
        "expires_at": _NUMBER_OR_NULL,
    }, description="A tool call waiting for a person.")
    return {
        "Problem": _closed({
            "type": {"type": "string", "description": "urn:perdure:problem:<kind>"},
            "title": {"type": "string"},
            "status": {"type": "integer"},
            "detail": {"type": "string"},
            "field": {"type": "string", "description": "the input field (or parameter) "
                      "that is wrong, for a bad input"},
        }, ["type", "title", "status", "detail"],
            "What went wrong (RFC 9457), for every 4xx and 5xx answer."),
        "Question": question,
        "Object": obj,
        "ObjectPage": _closed({
            "objects": {"type": "array", "items": _ref("Object")},
            "next_cursor": {"type": ["string", "null"],
                            "description": "pass as cursor for the next page (null: none)"},
        }),
        "StartRequest": _closed({
            "agent": {"type": "string", "description": "a registered agent's name"},
            "args": {"type": "array", "description": "positional arguments"},
            "kwargs": {"type": "object", "description": "keyword arguments"},
            "object_id": {"type": ["string", "null"],
                          "description": "the object's id (idempotent: an existing id "
                          "gives that object); null: generated"},
            "deadline": {"type": ["number", "null"], "exclusiveMinimum": 0,
                         "description": "seconds from now after which it is terminated"},
            "max_failures": {"type": ["integer", "null"], "minimum": 0},
            "labels": {"type": ["object", "null"],
                       "additionalProperties": {"type": "string"}},
            "budget": {"type": ["object", "null"],
                       "description": "caps on its model calls: tokens and/or cost"},
        }, ["agent"]),
        "Started": _closed({
            "object": _ref("Object"),
            "created": {"type": "boolean",
                        "description": "false: the id was taken by an object of this agent, "
                        "which this is"},
            "differs": {"type": ["string", "null"],
                        "description": "how that existing object was started otherwise"},
        }),
        "Result": _closed({
            "object_id": {"type": "string"},
            "status": {"type": "string", "enum": statuses},
            "done": {"type": "boolean", "description": "it has ended (completed, failed, "
                     "cancelled)"},
            "note": _STRING_OR_NULL,
            "result": {"description": "its result (completed only)"},
            "error": _closed({"type": {"type": "string"}, "message": {"type": "string"}},
                             description="why it failed (failed only)"),
        }, ["object_id", "status", "done", "note"]),
        "SendRequest": _closed({
            "name": {"type": "string", "description": "the event's name"},
            "payload": _ANY,
            "dedupe_key": {"type": ["string", "null"],
                           "description": "a key used before for this object: the event "
                           "is not sent again"},
        }, ["name"]),
        "AnswerRequest": _closed({
            "answer": _ANY,
            "event": {"type": ["string", "null"],
                      "description": "the event it waits for (null: whichever it is)"},
            "dedupe_key": {"type": ["string", "null"]},
        }, ["answer"]),
        "Sent": _closed({
            "sent": {"type": "boolean", "description": "false: the dedupe key was used "
                     "before; the event was sent once"},
            "event": {"type": "string"},
        }),
        "QueryRequest": _closed({"args": {"type": "array"}}, []),
        "QueryAnswer": _closed({"answer": _ANY}),
        "UpdateRequest": _closed({"args": {"type": "array"},
                                  "timeout": {"type": "number", "exclusiveMinimum": 0,
                                              "maximum": 60}}, []),
        "UpdateReply": _closed({"reply": _ANY}),
        "WebhookDelivered": _closed({
            "object_id": {"type": "string", "description": "the object started or signalled"},
            "applied": {"type": "boolean", "description": "false: this delivery was applied "
                        "before (a redelivery), and nothing changed now"},
            "delivery": {"type": "string", "description": "the delivery id: Webhook-Id, "
                         "else sig- and the signature's hex"},
        }),
        "QuestionList": _closed({"questions": {"type": "array",
                                               "items": _ref("Question")}}),
        "Approval": approval,
        "ApprovalList": _closed({
            "approvals": {"type": "array", "items": _ref("Approval")},
            "problems": {"type": "array", "items": {"type": "string"},
                         "description": "objects whose memory could not be read"},
        }),
        "DecisionRequest": _closed({
            "decision": {"type": "string", "enum": ["approve", "reject"]},
            "reason": {"type": "string", "maxLength": 2000,
                       "description": "why (required to reject: the model is told)"},
            "edit": {"type": ["object", "null"],
                     "description": "approve with these arguments instead (same tool); "
                     "they go through the policy again"},
        }, ["decision"]),
        "Decided": _closed({
            "decision": {"type": "string", "enum": ["approve", "edit", "reject"]},
            "approval": _ref("Approval"),
        }),
        "StreamEvent": _closed({
            "seq": {"type": "integer", "description": "its record; the event's id"},
            "kind": {"type": "string"},
            "ts": {"type": "number"},
            "line": {"type": "string", "description": "the record in words"},
            "name": {"type": ["string", "null"]},
            "pos": {"type": ["integer", "string", "null"]},
            "attempt": {"type": ["integer", "null"]},
            "data": {"description": "an emitted event's data"},
            "text": {"type": "string", "description": "a model_chunks batch's text"},
            "recovery": {"type": "string"},
            "outcome": {"type": ["string", "null"],
                        "description": "the terminated record's outcome"},
        }, ["seq", "kind", "ts", "line"], "The data of one server-sent event."),
    }


def _problem(description: str) -> dict[str, Any]:
    return {"description": description,
            "content": {"application/problem+json": {"schema": _ref("Problem")}}}


def _ok(description: str, schema: str) -> dict[str, Any]:
    return {"description": description,
            "content": {"application/json": {"schema": _ref(schema)}}}


def _operation(op_id: str, summary: str, scope: str | None, responses: dict[str, Any], *,
               body: str | None = None, body_required: bool = True,
               parameters: list[dict[str, Any]] | None = None,
               description: str = "") -> dict[str, Any]:
    op: dict[str, Any] = {"operationId": op_id, "summary": summary}
    if description:
        op["description"] = description
    if parameters:
        op["parameters"] = parameters
    if body is not None:
        op["requestBody"] = {"required": body_required, "content": {
            "application/json": {"schema": _ref(body)}}}
    answers = dict(responses)
    if scope is not None:
        op["security"] = [{"bearer": [scope]}]
        answers.setdefault("401", _problem("no token, or one unknown, revoked or expired"))
        answers.setdefault("403", _problem(f"the token lacks the scope {scope!r}"))
        answers.setdefault("429", _problem("too many requests with a wrong token"))
    answers["default"] = _problem("anything else that went wrong")
    op["responses"] = dict(sorted(answers.items()))
    return op


_OID = {"name": "object_id", "in": "path", "required": True, "schema": {"type": "string"},
        "description": "the object's id (percent-encoded)"}


def _query(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": schema,
            "description": description}


def _paths() -> dict[str, Any]:
    bad = _problem("an input is malformed or invalid (field names it)")
    missing = _problem("no such object")
    conflict = _problem("the object's state does not allow it")
    filters = [
        _query("status", {"type": "string", "enum": [s.value for s in Status]},
               "only objects with this status"),
        _query("phase", {"type": "string"}, "only objects in this phase"),
        _query("agent", {"type": "string"}, "only objects of this agent"),
        _query("version", {"type": "string"}, "only objects of this agent version"),
        _query("label", {"type": "string"}, "key=value"),
        _query("parent", {"type": "string"}, "only children of this object"),
        _query("node", {"type": "string"}, "only objects this node holds now"),
        _query("since", {"type": "string"}, "created at or after (epoch seconds or an "
               "ISO date and time)"),
        _query("until", {"type": "string"}, "created before"),
        _query("q", {"type": "string"}, "an object id or the start of one"),
        _query("limit", {"type": "integer", "minimum": 1, "maximum": 200, "default": 50},
               "objects per page"),
        _query("cursor", {"type": "string"}, "next_cursor of the page before"),
    ]
    controls = {
        verb: {"post": _operation(
            f"{verb}Object", summary, "operate",
            {"200": _ok("the object after it", "Object"), "404": missing,
             "409": conflict},
            parameters=[_OID], description=description)}
        for verb, summary, description in (
            ("pause", "Pause an object", "It stops at its next command boundary and is "
             "not claimed until resumed."),
            ("resume", "Resume an object", "Releases a paused object (or retries a parked "
             "one)."),
            ("cancel", "Cancel an object", "It terminates as cancelled at its next command "
             "boundary."),
            ("retry", "Retry a parked object", "After fixing what parked it; 409 when it is "
             "not parked."))
    }
    paths: dict[str, Any] = {
        "/openapi.json": {"get": {
            "operationId": "openapi", "summary": "This document",
            "responses": {"200": {"description": "the OpenAPI document",
                                  "content": {"application/json": {"schema": {
                                      "type": "object"}}}}}}},
        "/objects": {
            "post": _operation(
                "startObject", "Start an object", "operate",
                {"201": _ok("created", "Started"),
                 "200": _ok("the id was taken by an object of this agent: that object",
                            "Started"),
                 "400": bad, "409": _problem("the id belongs to another agent's object"),
                 "422": bad},
                body="StartRequest",
                description="Creates an object running agent(*args, **kwargs); the server "
                            "must be given the agents (--app). Noted in its memory with "
                            "the token's name."),
            "get": _operation(
                "listObjects", "List objects", "read",
                {"200": _ok("a page of objects, newest first", "ObjectPage"), "422": bad},
                parameters=filters),
        },
        "/objects/{object_id}": {"get": _operation(
            "getObject", "One object", "read",
            {"200": _ok("the object", "Object"), "404": missing}, parameters=[_OID])},
        "/objects/{object_id}/result": {"get": _operation(
            "getResult", "Its result, waiting for it", "read",
            {"200": _ok("the result once it has ended; else its status (done: false)",
                        "Result"),
             "404": missing, "422": bad,
             "503": _problem("too many waits open, or the store is unavailable")},
            parameters=[_OID, _query("wait", {"type": "number", "minimum": 0,
                                              "maximum": 60, "default": 0},
                                     "seconds to wait for the end (a long poll)")],
            description="Answers as soon as the object ends (or is parked), or when wait "
                        "seconds have passed; the server holds no thread meanwhile.")},
        "/objects/{object_id}/stream": {"get": _operation(
            "streamObject", "Follow what it emits (server-sent events)", "read",
            {"200": {"description": "text/event-stream: one event per record (id: its "
                                    "seq, event: its kind, data: a StreamEvent), ending "
                                    "after the object's terminated record; comment lines "
                                    "keep an idle stream alive",
                     "content": {"text/event-stream": {"schema": {"type": "string"}}}},
             "404": missing, "422": bad},
            parameters=[
                _OID,
                _query("after", {"type": "integer", "minimum": 0, "default": 0},
                       "start after this seq (the Last-Event-ID header wins)"),
                _query("every", {"type": "boolean", "default": False},
                       "every record, not only emitted events, model records and the "
                       "end"),
                {"name": "Last-Event-ID", "in": "header", "required": False,
                 "schema": {"type": "string"},
                 "description": "the id of the last event received: go on after it"}],
            description="Emitted events (run.emit), model calls' records and the end, "
                        "each once and in order; a reader that reconnects with "
                        "Last-Event-ID gets each event once.")},
        "/objects/{object_id}/events": {"post": _operation(
            "sendEvent", "Send an event", "operate",
            {"202": _ok("kept until the object waits for it", "Sent"), "400": bad,
             "404": missing, "409": _problem("the object has ended"), "422": bad},
            body="SendRequest", parameters=[_OID])},
        "/objects/{object_id}/answer": {"post": _operation(
            "answerQuestion", "Answer what it asks", "operate",
            {"202": _ok("the answer is sent", "Sent"), "400": bad, "404": missing,
             "409": _problem("the object is not waiting for an answer"), "422": bad},
            body="AnswerRequest", parameters=[_OID])},
        **{f"/objects/{{object_id}}/{verb}": op for verb, op in controls.items()},
        "/objects/{object_id}/queries/{name}": {"post": _operation(
            "queryObject", "A query over its memory", "read",
            {"200": _ok("the query's answer", "QueryAnswer"), "400": bad,
             "404": _problem("no such object or query"), "422": bad},
            body="QueryRequest", body_required=False,
            parameters=[_OID, {"name": "name", "in": "path", "required": True,
                               "schema": {"type": "string"}}],
            description="Answers a query declared for its agent; the object is not woken "
                        "and nothing is written.")},
        "/hooks/{name}": {"post": {
            **_operation(
                "deliverWebhook", "A signed webhook starts or signals an object", None,
                {"200": _ok("applied now, or before (a redelivery: applied false)",
                            "WebhookDelivered"),
                 "400": _problem("a malformed body or header"),
                 "401": _problem("not signed, a signature that does not match, or a "
                                 "timestamp outside the replay window"),
                 "404": _problem("no such webhook, or no object to signal"),
                 "409": _problem("the delivery id was used for other arguments, or the "
                                 "object to signal has ended"),
                 "413": _problem("the body is larger than the webhook takes"),
                 "422": _problem("the body does not fit: unknown agent, bad arguments"),
                 "503": _problem("the store is unavailable: deliver again later")},
                parameters=[
                    {"name": "name", "in": "path", "required": True,
                     "schema": {"type": "string"}, "description": "the webhook's name"},
                    {"name": "Webhook-Timestamp", "in": "header", "required": True,
                     "schema": {"type": "string"},
                     "description": "seconds since the epoch, when it was signed"},
                    {"name": "Webhook-Signature", "in": "header", "required": True,
                     "schema": {"type": "string"},
                     "description": "v1, and the base64 HMAC-SHA256 under the webhook's "
                                    "secret of <id>.<timestamp>.<body> (<timestamp>.<body> "
                                    "without an id); several separated by spaces"},
                    {"name": "Webhook-Id", "in": "header", "required": False,
                     "schema": {"type": "string"},
                     "description": "the delivery's id, the same on a redelivery"}],
                description="Declared with Triggers.of(app).webhook(name, ...). No token: "
                            "the signature authenticates. The body is the webhook's message "
                            "(a start: {args, kwargs}; a signal: the event's payload); "
                            "the delivery id names the object started or the event's "
                            "dedupe key, so a redelivery changes nothing."),
            "requestBody": {"required": True, "content": {"application/json": {
                "schema": _ANY}}}}},
        "/objects/{object_id}/updates/{name}": {"post": _operation(
            "updateObject", "Send an update and wait for its reply", "operate",
            {"200": _ok("the handler's reply", "UpdateReply"), "400": bad,
             "404": _problem("no such object, or its agent declares no such update"),
             "409": _problem("the handler failed, or the object has ended"),
             "422": _problem("a validator refused the request (nothing was written), or an "
                             "input is invalid"),
             "503": _problem("too many waits open, or the store is unavailable"),
             "504": _problem("no reply within timeout seconds (30 by default): the update "
                             "stays queued")},
            body="UpdateRequest", body_required=False,
            parameters=[_OID, {"name": "name", "in": "path", "required": True,
                               "schema": {"type": "string"}}],
            description="The declared validator runs first; an accepted update is "
                        "applied by the object while it waits in run.wait_for, and the "
                        "handler's return value is the reply (app.update over HTTP).")},
        "/questions": {"get": _operation(
            "listQuestions", "What waiting objects ask", "read",
            {"200": _ok("questions, newest first", "QuestionList"), "422": bad},
            parameters=[_query("agent", {"type": "string"}, "only this agent's objects"),
                        _query("limit", {"type": "integer", "minimum": 1, "maximum": 1000,
                                         "default": 100}, "at most this many")])},
        "/approvals": {"get": _operation(
            "listApprovals", "Tool calls waiting for a person", "read",
            {"200": _ok("pending approvals, newest first", "ApprovalList")},
            parameters=[_query("object_id", {"type": "string"}, "only this object's")])},
        "/objects/{object_id}/approvals/{proposal_id}": {"post": _operation(
            "decideApproval", "Approve or reject a tool call", "approve",
            {"200": _ok("the decision is sent, signed with the server's key", "Decided"),
             "400": bad,
             "403": _problem("the token lacks the scope, or the server's identity may not "
                             "decide on this call"),
             "404": _problem("no such object or proposal waiting"),
             "409": _problem("decided already, expired, or its memory does not verify"),
             "422": bad},
            body="DecisionRequest",
            parameters=[_OID, {"name": "proposal_id", "in": "path", "required": True,
                               "schema": {"type": "string"}}],
            description="Signed with the serving process's key, as the dashboard and "
                        "`perdure approve` do: the policy's approvers are checked against "
                        "that identity; the token's name is in the signed reason.")},
    }
    return dict(sorted(paths.items()))


def document() -> dict[str, Any]:
    """The OpenAPI 3.1 document of the HTTP API."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "perdure HTTP API",
            "version": API_VERSION,
            "description": "Start, watch, steer and approve perdure objects over HTTP. "
                           "Every operation but this document needs a bearer token "
                           "(perdure api-token create NAME --scope SCOPE) with the scope "
                           "it names; errors are problem documents. See "
                           "docs/howto/http-api.md.",
        },
        "servers": [{"url": PREFIX}],
        "paths": _paths(),
        "components": {
            "schemas": _schemas(),
            "securitySchemes": {"bearer": {
                "type": "http", "scheme": "bearer",
                "description": "An API token; scopes: read, operate, approve."}},
        },
    }


def document_text() -> str:
    """The document as the checked-in file holds it (indented, with a final newline)."""
    return json.dumps(document(), indent=2, ensure_ascii=False) + "\n"
