"""The conversation of the model-call benchmark, shared by perdure and its peers.

A system message, then user messages of about 300 characters, each different; the
scripted server (and the LangGraph peer's node) answers ``echo: <the user text>``.
"""

from __future__ import annotations

__all__ = ["SYSTEM", "user_text"]

SYSTEM = "You are a careful assistant. Answer briefly and say when you are unsure."

_FILLER = (
    "Please look at the figures from the last run again, compare them with the ones "
    "from the week before, and tell me which of the changes matter and which are noise. "
    "Keep the answer short; I will ask about the details in the next turn. "
)


def user_text(i: int) -> str:
    """The user's message of turn ``i`` (about 300 characters, unique per turn)."""
    return f"Turn {i}. {_FILLER}(question {i * 7919 % 10007})"
