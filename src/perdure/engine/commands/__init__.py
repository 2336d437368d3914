"""The commands an agent issues through its ``Run``, one family per module.

Every command takes the next *position* from the run's replay cursor (``Run._take``)
and then does one of two things, both written in its module side by side: the
**replay rule** (memory holds records at this position: return what they say, do
nothing again) and the **execution rule** (nothing recorded yet: do the work and
record it). A command's entry point is a plain function whose first parameter is
the ``Run`` (named ``self``); ``Run`` binds it as a method in one line
(``step = steps.step``), so calling ``run.step(...)`` costs no forwarding call.

- ``steps``: ``run.step`` (resolve its name → replay → execute → record)
- ``step_failures``: a step that fails, cannot run on this node, or keeps killing
  workers (retry later, fail for good, route elsewhere, park)
- ``waits``: ``run.sleep`` and ``run.wait_for`` (timers, events, event vouching)
- ``step_timeout``: ``run.step(fn, timeout=...)`` (an attempt that runs too long)
- ``values``: ``run.now``, ``run.uuid``, ``run.random`` and ``run.progress``
- ``emits``: ``run.emit`` (events for the object's followers, written once)
- ``lineage``: ``run.delegate``, ``run.join``, ``run.gather`` and ``ChildHandle``
- ``intent``: ``run.refine``, ``run.patched`` and ``run.deprecate_patch``
- ``model``: ``run.model`` (needs ``perdure[llm]``, imported at the first call), with
  ``model_calls`` (options, fallback lists, replay), ``model_attempts`` (choosing a
  client, failures, in-doubt stateful calls, recording the reply), ``model_streams``
  (journaled streams and their recovery), ``model_memory`` (values stored once per
  object), ``model_context`` (the prompt as a view, compaction) and ``model_budget``
- ``tools``: one tool call a model proposed (proposal, gate, a person's decision from
  ``tool_approvals``, the recorded call), and ``agent_loop``: ``run.agent``, the durable
  loop of model turns and tool calls
- ``positions``: how positions are numbered (the main line, ``gather`` branches)

A new command (a tool call, a resource) is one new module here and one line on
``Run``.
"""

__all__: list[str] = []
