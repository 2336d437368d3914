"""Token counting, offline: OpenAI encodings from the wheel, a stated approximation else."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from perdure.llm import (
    APPROXIMATION_FACTOR,
    BpeTokenCounter,
    ImagePart,
    Message,
    ScaledTokenCounter,
    TextPart,
    ToolCall,
    ToolSpec,
    counter_for_model,
)
from perdure.llm._tokens import IMAGE_TOKENS, MESSAGE_OVERHEAD, REPLY_OVERHEAD


def test_openai_encodings_give_tiktokens_ids() -> None:
    """``Hello, world!`` is 4 tokens in both encodings, with the ids tiktoken gives."""
    o200k = BpeTokenCounter("o200k_base")
    cl100k = BpeTokenCounter("cl100k_base")
    assert o200k._encoding.encode_ordinary("Hello, world!") == [13225, 11, 2375, 0]
    assert cl100k._encoding.encode_ordinary("Hello, world!") == [9906, 11, 1917, 0]
    assert o200k.count_text("Hello, world!") == 4
    assert o200k.count_text("") == 0


def test_special_token_text_is_ordinary_text() -> None:
    """Text that spells a special token is counted as text, not refused."""
    assert BpeTokenCounter().count_text("<|endoftext|>") > 1


@pytest.mark.parametrize(("model", "name"), [
    ("gpt-4o", "o200k_base"), ("gpt-4o-mini-2024-07-18", "o200k_base"),
    ("gpt-4.1", "o200k_base"), ("o3-mini", "o200k_base"), ("gpt-5", "o200k_base"),
    ("openai/gpt-4o", "o200k_base"), ("gpt-4-turbo", "cl100k_base"),
    ("gpt-3.5-turbo", "cl100k_base"),
    ("claude-sonnet-4-5", f"approx:o200k_base*{APPROXIMATION_FACTOR}"),
    ("llama-3.1-8b-instruct", f"approx:o200k_base*{APPROXIMATION_FACTOR}"),
])
def test_counter_per_model(model: str, name: str) -> None:
    """OpenAI models get their encoding; any other model the stated approximation."""
    assert counter_for_model(model).name == name


def test_approximation_is_the_scaled_count_rounded_up() -> None:
    """The approximation is the o200k count times the factor, rounded up."""
    text = "The quick brown fox jumps over the lazy dog, twice over."
    exact = BpeTokenCounter().count_text(text)
    approx = ScaledTokenCounter(BpeTokenCounter()).count_text(text)
    assert approx == math.ceil(exact * APPROXIMATION_FACTOR) > exact
    with pytest.raises(ValueError):
        ScaledTokenCounter(BpeTokenCounter(), 0)


def test_message_and_prompt_framing() -> None:
    """A message costs its text plus the framing; calls, tools and images add theirs."""
    counter = BpeTokenCounter()
    text = counter.count_text
    assert counter.count_message(Message.user("Hello, world!")) == MESSAGE_OVERHEAD + 4
    call = ToolCall("c1", "lookup", '{"id": 7}')
    assert counter.count_message(Message.assistant("", [call])) == (
        2 * MESSAGE_OVERHEAD + text("lookup") + text('{"id": 7}'))
    image = Message("user", (TextPart("x"), ImagePart("data:image/png;base64,AA")))
    assert counter.count_message(image) == MESSAGE_OVERHEAD + text("x") + IMAGE_TOKENS
    tool = ToolSpec("lookup", "Find it.", {"type": "object"})
    prompt = [Message.system("s"), Message.user("u")]
    assert counter.count_prompt(prompt, [tool]) > counter.count_prompt(prompt) == (
        REPLY_OVERHEAD + sum(counter.count_message(m) for m in prompt))


def test_counting_needs_no_network() -> None:
    """Counting works in a process that cannot open any socket (the encodings ship in
    the wheel)."""
    code = (
        "import socket\n"
        "def refuse(*a, **k): raise OSError('no network in this test')\n"
        "socket.socket.connect = refuse\n"
        "socket.create_connection = refuse\n"
        "from perdure.llm import counter_for_model\n"
        "print(counter_for_model('gpt-4o').count_text('offline counting works'),"
        " counter_for_model('gpt-4').count_text('offline counting works'))\n"
    )
    out = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True,
                         text=True, timeout=60, check=True).stdout.split()
    assert [int(n) for n in out] == [3, 3]
