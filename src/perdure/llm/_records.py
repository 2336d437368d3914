"""How an object's ``model_call`` records hold its conversation: each value once, numbered.

Every message, tool spec and reply message a call sends or gets, and each call's
constants (the server's base URL and the request parameters), is a *value* stored once
per object, in the ``blobs`` of the first ``model_call`` record that needs it, under a
number (``"0"``, ``"1"``, ...) that the object's later records use to name it. A
request is the model and the numbers of its messages in order, written as runs
(``[[0, 41]]`` is values 0 to 40), so a call's record grows with what is new in it and
not with the conversation. Numbers are given out in the process that records the call,
and the record names each value it adds by number, so memory read in any order rebuilds
the same table.

A streamed reply's text is already in memory, in its ``model_chunks`` records: its
message value holds ``{"streamed": attempt}`` instead of the text, and reading memory
puts the chunks' text back (with the text the attempt went on from, for a continued
stream). A continued stream's request names its prefix, the salvage of the attempt cut
short, the same way.

Nothing here keeps what memory can derive: the request's hash is the call's ``asked``
(written again only when a fallback asked another model), and the OpenTelemetry GenAI
attributes come from the stored fields (``recorded_calls``, ``attributes``). Reading
fails closed (``ValueError``) on a value named and never stored, a number stored twice
with two values, or a request that does not rebuild to its hash.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from perdure.core.records import Kind, Record
from perdure.errors import PerdureError
from perdure.llm._otel import AttributeValue, genai_attributes
from perdure.llm._recovery import Recovery, Salvage
from perdure.llm._reply import ModelReply, StreamChunk
from perdure.llm._storage import content_hash, request_hash
from perdure.llm._types import Message, ModelParams, ModelRequest, ToolSpec

__all__ = ["CallTable", "RecordedCall", "StoredCallError", "StreamTexts", "recorded_calls"]

STREAMED = "streamed"  # a message value whose text is its stream's chunks
_CHUNKS = Kind.MODEL_CHUNKS.value
_RECOVERED = Kind.MODEL_RECOVERED.value
_CALL = Kind.MODEL_CALL.value


class StoredCallError(PerdureError, ValueError):
    """A ``model_call`` record that does not read back (``seq`` names it)."""

    def __init__(self, seq: int, reason: str) -> None:
        super().__init__(f"record #{seq}: {reason}")
        self.seq = seq
        self.reason = reason


def _place(body: Mapping[str, Any]) -> tuple[str, str]:
    return str(body.get("pos")), str(body.get("name"))


class StreamTexts:
    """The streamed text at each call's position: every attempt's chunks and the
    recovery each attempt chose (``model_chunks``, ``model_recovered`` records)."""

    def __init__(self) -> None:
        self.chunks: dict[int, list[StreamChunk]] = {}
        self.recovered: dict[int, dict[str, Any]] = {}

    @classmethod
    def of(cls, recs: Iterable[Record]) -> StreamTexts:
        """The texts of one position's records."""
        texts = cls()
        for rec in recs:
            texts.take(rec)
        return texts

    def take(self, rec: Record) -> None:
        """Take in one record (those of other kinds are passed over)."""
        if rec.kind == _CHUNKS:
            self.add(int(rec.body["attempt"]), rec.body["chunks"])
        elif rec.kind == _RECOVERED:
            self.recovered[int(rec.body["attempt"])] = dict(rec.body)

    def add(self, attempt: int, chunks: Sequence[Any]) -> None:
        """Take in a batch of an attempt's chunks (JSON forms or chunks)."""
        self.chunks.setdefault(attempt, []).extend(
            c if isinstance(c, StreamChunk) else StreamChunk.from_json(c) for c in chunks)

    def prefix(self, attempt: int) -> str:
        """The text attempt ``attempt`` went on from (empty unless it continued)."""
        chosen = self.recovered.get(attempt)
        if chosen is None or chosen["recovery"] != Recovery.CONTINUE or attempt <= 1:
            return ""
        before = self.salvage(attempt - 1)
        return before.text if before is not None else ""

    def salvage(self, attempt: int) -> Salvage | None:
        """What attempt ``attempt`` left: its prefix and its chunks (``None``: nothing,
        neither text it went on from nor a chunk of its own)."""
        chunks = self.chunks.get(attempt, [])
        prefix = self.prefix(attempt)
        if not chunks and not prefix:
            return None
        return Salvage.from_chunks(chunks, prefix)


def _runs(numbers: Sequence[int]) -> list[int | list[int]]:
    """``numbers`` as items: a number, or ``[start, stop]`` for two or more in a row."""
    out: list[int | list[int]] = []
    i = 0
    while i < len(numbers):
        j = i + 1
        while j < len(numbers) and numbers[j] == numbers[j - 1] + 1:
            j += 1
        out.append([numbers[i], numbers[j - 1] + 1] if j - i >= 2 else numbers[i])
        i = j
    return out


def _numbers(items: Any, limit: int = 10_000_000) -> list[int]:
    """The numbers ``items`` (``_runs``) name, each below ``limit`` (the numbers memory
    gave out: a forged range cannot make a reader build a huge list)."""
    if not isinstance(items, list):
        raise ValueError(f"bad value list {items!r} in a stored model call")
    out: list[int] = []
    for item in items:
        if isinstance(item, int) and not isinstance(item, bool) and 0 <= item < limit:
            out.append(item)
        elif (isinstance(item, list) and len(item) == 2
              and all(isinstance(n, int) and not isinstance(n, bool) for n in item)
              and 0 <= item[0] < item[1] <= limit):
            out.extend(range(item[0], item[1]))
        else:
            raise ValueError(f"bad value reference {item!r} in a stored model call")
    return out


@dataclass(frozen=True, slots=True)
class EncodedCall:
    """What a call's record holds of it: ``request``, ``reply`` and the new ``blobs``."""

    request: dict[str, Any]
    reply: dict[str, Any]
    blobs: dict[str, Any]
    numbers: tuple[int, ...]  # the numbers given out for the new values


class CallTable:
    """An object's model values by number, and each value's number by content hash.

    ``learn`` takes in a ``model_call`` body read from memory; ``encode`` numbers the
    values of a call being recorded (the new ones are its ``blobs``); ``request_of`` and
    ``reply_of`` rebuild a stored call."""

    __slots__ = ("_texts", "index", "next", "values")

    def __init__(self) -> None:
        self.values: dict[int, Any] = {}
        self.index: dict[str, int] = {}
        self.next = 0
        self._texts: dict[tuple[str, str], StreamTexts] = {}

    @classmethod
    def of(cls, records: Iterable[Record]) -> CallTable:
        """The table of an object's records (any order)."""
        table = cls()
        calls = []
        for rec in records:
            if rec.kind in (_CHUNKS, _RECOVERED):
                table.texts(_place(rec.body)).take(rec)
            elif rec.kind == _CALL:
                calls.append(rec)
        for rec in calls:
            try:
                table.learn(rec.body)
            except ValueError as exc:
                raise StoredCallError(rec.seq, str(exc)) from None
        return table

    def texts(self, place: tuple[str, str]) -> StreamTexts:
        """The stream texts at a call's place (``(pos, name)``)."""
        texts = self._texts.get(place)
        if texts is None:
            texts = self._texts[place] = StreamTexts()
        return texts

    def note_chunks(self, place: tuple[str, str], rec: Record) -> None:
        """Take in a stream record written after the table was built."""
        self.texts(place).take(rec)

    def learn(self, body: Mapping[str, Any]) -> None:
        """Take in a ``model_call`` body's values (``ValueError`` on a bad one)."""
        blobs = body.get("blobs")
        if not isinstance(blobs, Mapping):
            raise ValueError("a stored model call without its values")
        for key, value in blobs.items():
            if not (isinstance(key, str) and key.isdigit() and len(key) <= 12):
                raise ValueError(f"bad value number {key!r} in a stored model call")
            number = int(key)
            if isinstance(value, Mapping) and STREAMED in value:
                value = self._streamed(body, value)
            if number in self.values and self.values[number] != value:
                raise ValueError(f"value {number} is stored twice with two values")
            self._put(number, value)

    def _streamed(self, body: Mapping[str, Any], value: Mapping[str, Any]) -> dict[str, Any]:
        attempt = value[STREAMED]
        if not isinstance(attempt, int) or isinstance(attempt, bool):
            raise ValueError(f"bad streamed attempt {attempt!r} in a stored model call")
        salvage = self.texts(_place(body)).salvage(attempt)
        if salvage is None:
            raise ValueError(f"a stored model reply names the chunks of attempt {attempt}, "
                             f"which memory does not hold")
        out = {k: v for k, v in value.items() if k != STREAMED}
        out["content"] = salvage.text
        return out

    def _put(self, number: int, value: Any) -> None:
        self.values[number] = value
        self.index.setdefault(content_hash(value), number)
        self.next = max(self.next, number + 1)

    def number(self, value: Any, new: dict[str, Any], stored: Any = None) -> int:
        """The number of ``value``: the one memory has, or a new one (``value`` then goes
        in ``new``, as ``stored`` if given)."""
        digest = content_hash(value)
        number = self.index.get(digest)
        if number is None:
            number = self.next
            self._put(number, value)
            new[str(number)] = value if stored is None else stored
        return number

    def forget(self, numbers: Iterable[int]) -> None:
        """Take back numbers given out for a record that was never written."""
        for number in numbers:
            value = self.values.pop(number, None)
            if value is not None and self.index.get(content_hash(value)) == number:
                del self.index[content_hash(value)]

    def encode(self, sent: ModelRequest, asked: str, reply: ModelReply, *,
               base_url: str | None, provider: str, streamed: int | None = None,
               prefix_from: int | None = None) -> EncodedCall:
        """Number the values of a call (``streamed``: the attempt whose chunks hold the
        reply's text, when they do; ``prefix_from``: the attempt whose salvage is the
        request's prefix, a continued stream's)."""
        new: dict[str, Any] = {}
        messages = [self.number(m.to_json(), new) for m in sent.messages]
        tools = [self.number(t.to_json(), new) for t in sent.tools]
        setup: dict[str, Any] = {}
        if base_url:
            setup["base_url"] = base_url
        params = sent.params.to_json()
        if params:
            setup["params"] = params
        request: dict[str, Any] = {"model": sent.model, "messages": _runs(messages)}
        if tools:
            request["tools"] = _runs(tools)
        if setup:
            request["setup"] = self.number(setup, new)
        if sent.prefix:
            request["prefix"] = sent.prefix if prefix_from is None else {STREAMED: prefix_from}
        digest = request_hash(sent)
        if digest != asked:
            request["hash"] = digest
        message = reply.message().to_json()
        stored = None
        if streamed is not None and reply.text and message.get("content") == reply.text:
            stored = {k: v for k, v in message.items() if k != "content"}
            stored[STREAMED] = streamed
        answer = reply.to_json()
        for key in ("text", "tool_calls"):
            answer.pop(key, None)
        if answer.get("provider") == provider:
            del answer["provider"]
        if answer.get("model") == sent.model:
            del answer["model"]
        answer["latency"] = round(reply.latency, 3)
        answer["message"] = self.number(message, new, stored)
        return EncodedCall(request, answer, new, tuple(int(k) for k in new))

    def _value(self, number: int) -> Any:
        try:
            return self.values[number]
        except KeyError:
            raise ValueError(f"a stored model call names value {number}, which memory "
                             f"does not hold") from None

    def setup_of(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """The constants a stored request names (base URL, parameters)."""
        number = request.get("setup")
        if number is None:
            return {}
        if not isinstance(number, int) or isinstance(number, bool):
            raise ValueError(f"bad constants reference {number!r} in a stored model call")
        value = self._value(number)
        if not isinstance(value, Mapping):
            raise ValueError(f"value {number} is not a model call's constants")
        return dict(value)

    def request_of(self, body: Mapping[str, Any]) -> ModelRequest:
        """The request a ``model_call`` body sent, checked against its hash."""
        stored = body.get("request")
        if not isinstance(stored, Mapping) or "model" not in stored:
            raise ValueError("a stored model call without its request")
        setup = self.setup_of(stored)
        try:
            request = ModelRequest(
                str(stored["model"]),
                tuple(Message.from_json(self._value(n))
                      for n in _numbers(stored.get("messages"), self.next)),
                tuple(ToolSpec.from_json(self._value(n))
                      for n in _numbers(stored.get("tools", []), self.next)),
                ModelParams.from_json(setup.get("params", {})), self._prefix(body, stored))
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"a stored model request does not read back: {exc!r}") from None
        expected = stored.get("hash", body.get("asked"))
        if request_hash(request) != expected:
            raise ValueError(f"a stored model request rebuilds to hash "
                             f"{request_hash(request)}, not the recorded {expected}")
        return request

    def _prefix(self, body: Mapping[str, Any], stored: Mapping[str, Any]) -> str:
        prefix = stored.get("prefix", "")
        if isinstance(prefix, str):
            return prefix
        if isinstance(prefix, Mapping) and set(prefix) == {STREAMED}:
            return str(self._streamed(body, {STREAMED: prefix[STREAMED]})["content"])
        raise ValueError(f"bad prefix {prefix!r} in a stored model request")

    def reply_of(self, body: Mapping[str, Any]) -> ModelReply:
        """The reply a ``model_call`` body holds, as the agent got it."""
        reply, request = body.get("reply"), body.get("request")
        if not isinstance(reply, Mapping) or not isinstance(request, Mapping):
            raise ValueError("a stored model call without its reply")
        stored = dict(reply)
        number = stored.pop("message", None)
        if not isinstance(number, int) or isinstance(number, bool):
            raise ValueError(f"bad reply message reference {number!r} in a stored model call")
        try:
            message = Message.from_json(self._value(number))
            stored.setdefault("model", request.get("model", ""))
            stored.setdefault("provider", body.get("provider", ""))
            stored["text"] = message.text
            stored["tool_calls"] = [c.to_json() for c in message.tool_calls]
            return ModelReply.from_json(stored)
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"a stored model reply does not read back: {exc!r}") from None


@dataclass(frozen=True, slots=True)
class RecordedCall:
    """One ``model_call`` as memory holds it, rebuilt: where it was made, the request
    sent, the reply, the cost (``None``: not priced) and its OpenTelemetry GenAI
    attributes (derived from the stored fields, no message content)."""

    seq: int
    pos: int | str
    name: str
    attempt: int
    provider: str
    base_url: str | None
    request: ModelRequest
    reply: ModelReply
    cost: Decimal | None
    attributes: dict[str, AttributeValue] = field(default_factory=dict)


def recorded_calls(records: Iterable[Record]) -> list[RecordedCall]:
    """Every model call an object's records hold, rebuilt, in the order recorded
    (``StoredCallError``, a ``ValueError``, when memory does not hold what a call
    names)."""
    listed = list(records)
    table = CallTable.of(listed)
    out = []
    for rec in sorted((r for r in listed if r.kind == _CALL), key=lambda r: r.seq):
        body = rec.body
        try:
            request = table.request_of(body)
            reply = table.reply_of(body)
        except ValueError as exc:
            raise StoredCallError(rec.seq, str(exc)) from None
        base_url = table.setup_of(body["request"]).get("base_url")
        provider = str(body["provider"])
        cost = body.get("cost")
        out.append(RecordedCall(
            rec.seq, body["pos"], str(body["name"]), int(body["attempt"]), provider,
            base_url, request, reply, None if cost is None else Decimal(str(cost)),
            genai_attributes(request, reply, provider=provider, base_url=base_url)))
    return out
