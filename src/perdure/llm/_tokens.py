"""Token counting per model, offline.

OpenAI models are counted with their own byte-pair encodings (``o200k_base`` for the
GPT-4o/4.1/5 and o-series families, ``cl100k_base`` for GPT-4 and GPT-3.5), from the
``bpe-openai`` package, whose wheel carries the encoding files: nothing is downloaded
at first use (``tiktoken`` fetches them from the network, which a worker may not reach).
Its token ids equal ``tiktoken``'s.

Other models (Anthropic's, open models behind a compatible server) have tokenizers that
are not public or not shipped here. Their count is a stated approximation: the
``o200k_base`` count times 1.3, rounded up (``APPROXIMATION_FACTOR``). The factor is a
margin chosen to over-count, not a calibration of any one tokenizer: a prompt that fits
by this count is meant to leave room. Where the exact figure matters, use the
provider's own count (Anthropic's ``count_tokens``) or pass a counter of your own
(anything with the ``TokenCounter`` methods).

A message costs its text plus a fixed overhead (``MESSAGE_OVERHEAD``, the role and
separators of the chat format; ``REPLY_OVERHEAD`` primes the reply); a tool call costs
its name and arguments, a tool spec its canonical JSON, an image ``IMAGE_TOKENS``.
These framing numbers follow OpenAI's published accounting for chat models and are an
approximation for the others.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import math
import warnings
from collections.abc import Sequence
from typing import Any, Protocol

from perdure.llm._storage import canonical
from perdure.llm._types import ImagePart, Message, TextPart, ToolSpec

__all__ = [
    "APPROXIMATION_FACTOR",
    "IMAGE_TOKENS",
    "MESSAGE_OVERHEAD",
    "REPLY_OVERHEAD",
    "BpeTokenCounter",
    "ScaledTokenCounter",
    "TokenCounter",
    "counter_for_model",
    "encoding_for_model",
    "load_counter",
]

APPROXIMATION_FACTOR = 1.3
MESSAGE_OVERHEAD = 3
REPLY_OVERHEAD = 3
IMAGE_TOKENS = 1000

_O200K_PREFIXES = ("gpt-4o", "gpt-4.1", "gpt-4.5", "gpt-5", "o1", "o3", "o4", "chatgpt-4o",
                   "gpt-oss", "codex")
_CL100K_PREFIXES = ("gpt-4", "gpt-3.5", "gpt-35", "text-embedding-3", "text-embedding-ada")


class TokenCounter(Protocol):
    """Counts tokens of text and of messages as a model would see them."""

    @property
    def name(self) -> str:
        """What the counter is: an encoding name, or the approximation it makes."""
        ...

    def count_text(self, text: str) -> int:
        """Tokens in ``text``."""
        ...

    def count_message(self, message: Message) -> int:
        """Tokens ``message`` takes in a prompt, its framing included."""
        ...

    def count_prompt(self, messages: Sequence[Message], tools: Sequence[ToolSpec] = ()) -> int:
        """Tokens of a whole prompt: messages, tools and the reply's priming."""
        ...


@functools.lru_cache(maxsize=4)
def _encoding(name: str) -> Any:
    # bpe-openai reads its bundled files through a deprecated importlib.resources call;
    # that warning is its own business, not the caller's (who may run with -W error).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        bpe: Any = importlib.import_module("bpe_openai")
        return bpe.get_encoding(name)


def encoding_for_model(model: str) -> str | None:
    """The OpenAI encoding a model name uses, or ``None`` if it is not an OpenAI model
    we know (then counting is approximate)."""
    name = model.lower().rsplit("/", 1)[-1]  # "openai/gpt-4o" as a proxy names it
    if name.startswith(_O200K_PREFIXES):
        return "o200k_base"
    if name.startswith(_CL100K_PREFIXES):
        return "cl100k_base"
    return None


class _MessageCounting:
    """Message and prompt counting in terms of ``count_text``."""

    def count_text(self, text: str) -> int:
        raise NotImplementedError

    def count_message(self, message: Message) -> int:
        """Tokens ``message`` takes in a prompt, its framing included."""
        total = MESSAGE_OVERHEAD
        for part in message.content:
            if isinstance(part, TextPart):
                total += self.count_text(part.text)
            elif isinstance(part, ImagePart):
                total += IMAGE_TOKENS
        for call in message.tool_calls:
            total += MESSAGE_OVERHEAD + self.count_text(call.name)
            total += self.count_text(call.arguments)
        return total

    def count_prompt(self, messages: Sequence[Message], tools: Sequence[ToolSpec] = ()) -> int:
        """Tokens of a whole prompt: messages, tools and the reply's priming."""
        total = REPLY_OVERHEAD + sum(self.count_message(m) for m in messages)
        for tool in tools:
            total += self.count_text(canonical(tool.to_json()).decode("utf-8"))
        return total


class BpeTokenCounter(_MessageCounting):
    """Exact text counts with an OpenAI encoding (``o200k_base``, ``cl100k_base``),
    special-token text counted as ordinary text."""

    def __init__(self, encoding: str = "o200k_base") -> None:
        self._encoding_name = encoding
        self._encoding = _encoding(encoding)

    @property
    def name(self) -> str:
        """The encoding's name."""
        return self._encoding_name

    def count_text(self, text: str) -> int:
        """Tokens in ``text``."""
        return len(self._encoding.encode_ordinary(text)) if text else 0


class ScaledTokenCounter(_MessageCounting):
    """An approximation: another counter's count times ``factor``, rounded up."""

    def __init__(self, inner: BpeTokenCounter, factor: float = APPROXIMATION_FACTOR) -> None:
        if factor <= 0:
            raise ValueError("factor must be positive")
        self._inner = inner
        self._factor = factor

    @property
    def name(self) -> str:
        """``approx:<encoding>*<factor>``."""
        return f"approx:{self._inner.name}*{self._factor}"

    def count_text(self, text: str) -> int:
        """The inner count scaled by the factor, rounded up."""
        return math.ceil(self._inner.count_text(text) * self._factor)


def counter_for_model(model: str) -> TokenCounter:
    """The counter for ``model``: exact for OpenAI models, the stated approximation
    (the ``o200k_base`` count times ``APPROXIMATION_FACTOR``) for any other."""
    encoding = encoding_for_model(model)
    if encoding is not None:
        return BpeTokenCounter(encoding)
    return ScaledTokenCounter(BpeTokenCounter("o200k_base"))


_LOADED: set[str] = set()  # encodings read already (``load_counter``)


async def load_counter(model: str) -> TokenCounter:
    """``counter_for_model(model)``, its encoding read on a thread the first time: reading
    one takes most of a second, which must never hold up an event loop (a worker's lease
    renewals, its other objects)."""
    name = encoding_for_model(model) or "o200k_base"
    if name not in _LOADED:
        await asyncio.to_thread(_encoding, name)
        _LOADED.add(name)
    return counter_for_model(model)
