"""The API holds to its checked-in OpenAPI document (docs/reference/openapi.json): the
served document is that file; every route is in it and every path in it is a route; and
a client drives the whole API validating each request it sends and each response it
gets (status, media type, body, each server-sent event) against the document's schemas.
``perdure api --write-openapi docs/reference/openapi.json`` regenerates the file."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
from referencing import Registry
from referencing.jsonschema import DRAFT202012

from perdure import Secret, web
from perdure.core.lifecycle import Status
from perdure.llm.scripted import ScriptedServer
from perdure.triggers import Triggers, sign
from tests.web import agents
from tests.web.api_support import ServedApi, serve_api, stop_api
from tests.web.support import ROOT, wait_until

pytestmark = pytest.mark.timeout(120)

CHECKED_IN = ROOT / "docs" / "reference" / "openapi.json"
DOCUMENT: dict[str, Any] = json.loads(CHECKED_IN.read_text(encoding="utf-8"))
REGISTRY: Registry[Any] = Registry().with_resource(
    "urn:perdure:openapi", DRAFT202012.create_resource(DOCUMENT))


def _validate(instance: Any, schema: dict[str, Any], what: str) -> None:
    """Validate ``instance`` against ``schema``, a part of the document (its ``$ref``s
    resolved in the document)."""
    wrapped = {"$ref": "urn:perdure:openapi#/" + _pointer_of(schema)}
    validator = jsonschema.Draft202012Validator(wrapped, registry=REGISTRY)
    errors = sorted(validator.iter_errors(instance), key=lambda e: list(e.path))
    assert not errors, f"{what}: {errors[0].message} at {list(errors[0].path)}: {instance!r}"


_POINTERS: dict[int, str] = {}


def _index(node: Any, pointer: str) -> None:
    if isinstance(node, dict):
        _POINTERS[id(node)] = pointer
        for key, value in node.items():
            _index(value, f"{pointer}/{str(key).replace('~', '~0').replace('/', '~1')}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            _index(value, f"{pointer}/{i}")


_index(DOCUMENT, "")


def _pointer_of(schema: dict[str, Any]) -> str:
    return _POINTERS[id(schema)].lstrip("/")


def _operation(method: str, path: str) -> tuple[str, dict[str, Any]]:
    """The document's template and operation for a request's path (under /api/v1)."""
    for template, item in DOCUMENT["paths"].items():
        pattern = "^" + re.sub(r"\\{[^/]+?\\}", "[^/]+", re.escape(template)) + "$"
        if re.match(pattern, path) and method.lower() in item:
            return template, item[method.lower()]
    raise AssertionError(f"{method} {path} is in no path of the document")


class Contract:
    """An HTTP client of the API that validates what it sends and gets."""

    def __init__(self, client: httpx.Client) -> None:
        self.client = client
        self.seen: set[tuple[str, str, str]] = set()

    def request(self, method: str, path: str, *, json_body: Any = None,
                valid: bool = True, **options: Any) -> httpx.Response:
        """Send a request; with ``valid`` its body must fit the document (bad input is
        sent with ``valid=False``). The response is always validated."""
        template, op = _operation(method, path.split("?")[0])
        body = op.get("requestBody")
        if valid and json_body is not None:
            assert body is not None, f"{method} {template} takes no body"
            _validate(json_body, body["content"]["application/json"]["schema"],
                      f"request {method} {template}")
        if valid and body is not None and body["required"]:
            assert json_body is not None, f"{method} {template} needs a body"
        got = self.client.request(method, path, json=json_body, **options)
        self.check(method, template, op, got)
        return got

    def check(self, method: str, template: str, op: dict[str, Any],
              got: httpx.Response, text: str | None = None) -> None:
        """Validate a response against the operation's responses."""
        code = str(got.status_code)
        responses = op["responses"]
        answer = responses.get(code) or responses.get(f"{code[0]}XX") or responses["default"]
        assert code in responses or got.status_code >= 400, (
            f"{method} {template} answered {code}, which the document does not list")
        media = got.headers.get("content-type", "").split(";")[0]
        content = answer.get("content", {})
        assert media in content, f"{method} {template} {code}: {media} not in {list(content)}"
        self.seen.add((method, template, code))
        if media in ("application/json", "application/problem+json"):
            _validate(got.json() if text is None else json.loads(text),
                      content[media]["schema"], f"response {method} {template} {code}")

    def stream(self, path: str, **options: Any) -> Iterator[dict[str, Any]]:
        """The events of a server-sent event stream, each one's data validated as a
        ``StreamEvent``."""
        template, op = _operation("GET", path)
        with self.client.stream("GET", path, **options) as got:
            if got.status_code != 200:
                got.read()
                self.check("GET", template, op, got)
                return
            assert got.headers["content-type"].startswith("text/event-stream")
            self.seen.add(("GET", template, "200"))
            event: dict[str, str] = {}
            for line in got.iter_lines():
                if line == "" and event:
                    data = json.loads(event["data"])
                    _validate(data, DOCUMENT["components"]["schemas"]["StreamEvent"],
                              "stream event")
                    assert int(event["id"]) == data["seq"] and event["event"] == data["kind"]
                    yield data
                    event = {}
                elif line and not line.startswith(":") and not line.startswith("retry"):
                    key, _, value = line.partition(":")
                    event[key] = value.removeprefix(" ")


def test_the_served_document_is_the_checked_in_file(sqlite_url: str, key_dir: Path) -> None:
    assert web.openapi_text() == CHECKED_IN.read_text(encoding="utf-8"), (
        "docs/reference/openapi.json is out of date: run "
        "`perdure api --write-openapi docs/reference/openapi.json`")
    served = serve_api(sqlite_url, key_dir)
    try:
        with closing(served.client(None)) as client:
            assert client.get("/openapi.json").json() == DOCUMENT
        routes = {(r.method.lower(), r.path) for r in served.api.routes}
        documented = {(m, p) for p, item in DOCUMENT["paths"].items() for m in item}
        assert routes == documented
    finally:
        stop_api(served)
    jsonschema.Draft202012Validator.check_schema({"$defs": DOCUMENT["components"]["schemas"]})
    assert DOCUMENT["openapi"].startswith("3.1.")


HOOK_SECRET = "contract-webhook-secret-0123456789"


@pytest.fixture
def served(sqlite_url: str, key_dir: Path) -> Iterator[ServedApi]:
    declared = Triggers()
    declared.webhook("ticks", agent="ticker", secret=Secret(HOOK_SECRET))
    api = serve_api(sqlite_url, key_dir, triggers=declared)
    yield api
    stop_api(api)


def test_a_client_held_to_the_document(served: ServedApi, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(agents.OUTBOX_ENV, str(tmp_path / "outbox.jsonl"))
    monkeypatch.setenv(agents.EFFECTS_ENV, str(tmp_path / "effects.txt"))
    app = served.app
    with app.background_worker(), ScriptedServer(responder=agents.scripted) as model, \
            closing(served.client("operator")) as op_client, \
            closing(served.client("approver")) as ap_client, \
            closing(served.client(None)) as anonymous:
        api, approver, nobody = Contract(op_client), Contract(ap_client), Contract(anonymous)
        nobody.request("GET", "/openapi.json")
        nobody.request("GET", "/objects")
        hook_body = json.dumps({"args": [2]}).encode()
        signed = sign(HOOK_SECRET, hook_body, int(time.time()), "contract-1")
        nobody.request("POST", "/hooks/ticks", content=hook_body, headers=signed, valid=False)
        nobody.request("POST", "/hooks/ticks", content=hook_body, valid=False)
        started = api.request("POST", "/objects", json_body={
            "agent": "ticker", "args": [2], "object_id": "c-1", "deadline": 600,
            "max_failures": 3, "labels": {"kind": "contract"},
            "budget": {"tokens": 100000}}).json()
        assert started["created"] is True
        api.request("POST", "/objects", json_body={"agent": "ticker", "args": [2],
                                                   "object_id": "c-1"})
        api.request("POST", "/objects", json_body={"agent": 1}, valid=False)
        api.request("POST", "/objects", content=b"{", valid=False)
        wait_until(lambda: app.get("c-1").status is Status.DORMANT)
        api.request("GET", "/objects/c-1")
        api.request("GET", "/objects/nobody")
        api.request("GET", "/objects", params={"agent": "ticker", "limit": 1})
        api.request("GET", "/objects", params={"status": "nope"}, valid=False)
        api.request("GET", "/objects/c-1/result")
        api.request("GET", "/objects/c-1/result", params={"wait": 0.2})
        api.request("GET", "/questions")
        api.request("POST", "/objects/c-1/queries/ticks", json_body={"args": [1]})
        api.request("POST", "/objects/c-1/queries/ticks")
        api.request("POST", "/objects/c-1/queries/missing")
        cart = app.options(object_id="cart-c").start("cart", "cy").object_id
        wait_until(lambda: app.get(cart).status is Status.DORMANT)
        assert api.request("POST", f"/objects/{cart}/updates/add_item",
                           json_body={"args": ["tea"]}).json() == {"reply": 1}
        api.request("POST", f"/objects/{cart}/updates/add_item", json_body={"args": [""]})
        api.request("POST", f"/objects/{cart}/updates/nope")
        api.request("POST", "/objects/c-1/pause")
        api.request("POST", "/objects/c-1/resume")
        api.request("POST", "/objects/c-1/retry")
        api.request("POST", "/objects/c-1/events", json_body={"name": "nudge", "payload": 1,
                                                              "dedupe_key": "n-1"})
        wait_until(lambda: app.get("c-1").status is Status.DORMANT)
        api.request("POST", "/objects/c-1/answer", json_body={"answer": {"ok": True}})
        done = api.request("GET", "/objects/c-1/result", params={"wait": 20}).json()
        assert done["done"] is True and done["result"]["go"] == {"ok": True}
        events = list(api.stream("/objects/c-1/stream", params={"every": "true"}))
        assert events[-1]["kind"] == "terminated" and len(events) == done_records(app, "c-1")
        assert [e.get("name") for e in api.stream("/objects/c-1/stream")][:2] == ["tick", "tick"]
        list(api.stream("/objects/nobody/stream"))
        api.request("POST", "/objects/c-1/cancel")

        fickle = api.request("POST", "/objects", json_body={"agent": "fickle"}).json()[
            "object"]["object_id"]
        wait_until(lambda: app.get(fickle).status is Status.DORMANT)
        api.request("POST", f"/objects/{fickle}/events", json_body={"name": "go"})
        parked = api.request("GET", f"/objects/{fickle}/result", params={"wait": 20}).json()
        assert parked["status"] == "parked" and parked["done"] is False and parked["note"]
        api.request("POST", f"/objects/{fickle}/retry")

        victim = api.request("POST", "/objects", json_body={"agent": "sleeper",
                                                            "args": [600]}).json()
        api.request("POST", f"/objects/{victim['object']['object_id']}/cancel")

        held = app.start("assistant", model.openai_base_url).object_id
        wait_until(lambda: any(p.object_id == held for p in app.approvals()), 30)
        pending = approver.request("GET", "/approvals").json()["approvals"]
        pid = next(p["proposal_id"] for p in pending if p["object_id"] == held)
        approver.request("GET", "/approvals", params={"object_id": held})
        api.request("POST", f"/objects/{held}/approvals/{pid}",
                    json_body={"decision": "approve"})
        approver.request("POST", f"/objects/{held}/approvals/{pid}",
                         json_body={"decision": "reject"}, valid=False)
        approver.request("POST", f"/objects/{held}/approvals/{pid}",
                         json_body={"decision": "approve", "reason": "fine"})
        approver.request("POST", f"/objects/{held}/approvals/{pid}",
                         json_body={"decision": "approve"})
        assert app.handle(held).result(timeout=30).startswith("Done")

    seen = api.seen | approver.seen | nobody.seen
    for template, item in DOCUMENT["paths"].items():
        for method in item:
            assert any(m == method.upper() and t == template and c.startswith("2")
                       for m, t, c in seen), f"{method.upper()} {template} never answered 2xx"
    codes = {c for _, _, c in seen}
    assert {"400", "401", "403", "404", "409", "422"} <= codes


def done_records(app: Any, oid: str) -> int:
    """How many records the object's memory holds."""
    return len(app.history(oid))
