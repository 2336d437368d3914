"""What ``run.model(..., context=ContextPolicy(...))`` does with a conversation that would
not fit the model's window: a policy, pure.

The agent passes its whole conversation (every message, append-only) each call; the
policy makes the prompt a *view* of it (``prompt_view``): the leading system messages, a
summary of older turns when there is one, and the latest turns that fit ``window``
minus ``reserve`` tokens. When the conversation (after the summary in force) takes more
than ``trigger`` of that budget, older turns are summarised first by a model call of its
own (``plan_compaction``), recorded like any call; only a summary that came back
replaces them in the view. Nothing is deleted from memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from perdure.errors import ConfigurationError
from perdure.llm._tokens import TokenCounter
from perdure.llm._window import SUMMARY_INSTRUCTIONS

if TYPE_CHECKING:
    from perdure.llm._clients import ModelClient

__all__ = ["ContextPolicy"]


@dataclass(frozen=True, slots=True)
class ContextPolicy:
    """How ``run.model`` keeps a prompt within the model's window.

    ``window``: the model's context window in tokens; ``reserve``: tokens kept for the
    reply. Compaction starts when the conversation after the summary in force takes more
    than ``trigger`` of the budget (``window - reserve``, less the system messages); it
    keeps the latest turns that take at most ``keep`` of the budget and summarises the
    rest with ``summary_model`` (default: the call's model) on ``summary_client``
    (default: the call's clients), with ``instructions`` and at most
    ``summary_max_tokens`` tokens. ``counter`` counts tokens (default:
    ``counter_for_model`` of the call's model). ``name`` names the conversation: its
    summaries are recorded as the model call ``<name>.summary``, and two conversations
    of one object need two names. ``compact=False`` only fits the view, never
    summarises.
    """

    window: int
    reserve: int = 1024
    trigger: float = 0.8
    keep: float = 0.5
    summary_model: str | None = None
    summary_client: ModelClient | None = None
    instructions: str = SUMMARY_INSTRUCTIONS
    summary_max_tokens: int | None = 1024
    counter: TokenCounter | None = None
    name: str = "context"
    compact: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.window, int) or isinstance(self.window, bool) or self.window < 1:
            raise ConfigurationError(f"ContextPolicy.window must be a positive number of "
                                     f"tokens, not {self.window!r}")
        if not isinstance(self.reserve, int) or not 0 <= self.reserve < self.window:
            raise ConfigurationError(f"ContextPolicy.reserve must be 0 or more tokens and "
                                     f"less than the window ({self.window}), not "
                                     f"{self.reserve!r}")
        if not 0 < self.trigger <= 1 or not 0 < self.keep < 1 or self.keep > self.trigger:
            raise ConfigurationError(f"ContextPolicy needs 0 < keep < 1, keep <= trigger and "
                                     f"0 < trigger <= 1, not keep={self.keep!r}, "
                                     f"trigger={self.trigger!r}")
        if not self.name or not self.instructions.strip():
            raise ConfigurationError("ContextPolicy needs a name and summary instructions")
        if self.summary_max_tokens is not None and self.summary_max_tokens < 1:
            raise ConfigurationError("ContextPolicy.summary_max_tokens must be positive")
