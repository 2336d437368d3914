"""``perdure demo --llm`` end to end: the scripted model server, a worker SIGKILLed
mid-stream, a second worker continuing the draft from the salvaged text."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("openai")

import perdure
from perdure.core.records import Kind
from perdure.demo.llm_agent import DRAFT


def _offline_env() -> dict[str, str]:
    """The environment without settings that could point the demo elsewhere."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("PERDURE_", "OPENAI_"))}


def test_llm_demo_continues_a_killed_stream_from_its_salvage(tmp_path: Path) -> None:
    """Exit 0; the draft was salvaged, continued (recorded) and joined whole; the ledger
    is in ``perdure show``; memory verifies."""
    folder = tmp_path / "demo"
    env = _offline_env()
    proc = subprocess.run(
        [sys.executable, "-m", "perdure", "demo", "--llm", "--dir", str(folder), "--fresh"],
        capture_output=True, text=True, timeout=90, env=env, cwd=tmp_path,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    for line in ("scripted local model server", "Kill worker A with SIGKILL",
                 "memory holds", "recorded the recovery: continue",
                 "continuation request", "joined draft", "model calls: 3,",
                 "verify ok", "llm demo passed"):
        assert line in output, (line, output)

    app = perdure.App(store=f"sqlite:///{folder / 'demo.db'}", key_dir=folder / "keys")
    try:
        records = app.history("llm-demo-1")
        calls = [r.body for r in records if r.kind == Kind.MODEL_CALL]
        assert [c["name"] for c in calls] == ["outline", "draft", "summary"]
        recovered = [r.body for r in records if r.kind == Kind.MODEL_RECOVERED]
        assert recovered and all(b["recovery"] == "continue" for b in recovered)
        assert recovered[0]["chars"] > 0
        assert {r.node_id for r in records if r.kind == Kind.MODEL_CALL} == {
            "demo-node-a", "demo-node-b"}
        assert records[-1].kind == Kind.TERMINATED
        assert records[-1].body["result"]["draft"] == DRAFT
        assert app.verify("llm-demo-1").ok
        assert app.usage("llm-demo-1").calls == 3
    finally:
        app.close()

    show = subprocess.run(
        [sys.executable, "-m", "perdure", "--store", f"sqlite:///{folder / 'demo.db'}",
         "--key-dir", str(folder / "keys"), "show", "llm-demo-1"],
        capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path,
    )
    assert show.returncode == 0, show.stdout + show.stderr
    assert "model calls: 3" in show.stdout
    assert "model_recovered" in show.stdout  # the recovery, in the memory table


def test_the_model_call_example_runs_offline_and_replays_from_memory(tmp_path: Path) -> None:
    """``examples/model_call.py`` answers from the scripted server, prints the ledger, and
    run again prints the same answer from memory."""
    example = Path(__file__).resolve().parents[2] / "examples" / "model_call.py"
    runs = [subprocess.run([sys.executable, str(example)], capture_output=True, text=True,
                           timeout=90, env=_offline_env(), cwd=tmp_path) for _ in range(2)]
    for proc in runs:
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "echo: Explain durable execution" in proc.stdout
        assert "model calls: 2, 0 failed attempt(s)" in proc.stdout
    assert runs[0].stdout == runs[1].stdout


def test_llm_demo_uses_the_endpoint_in_openai_base_url(tmp_path: Path) -> None:
    """With ``OPENAI_BASE_URL``/``OPENAI_API_KEY`` set, the demo asks that endpoint (here
    a scripted server standing in for one) with that key and model, and still continues
    the killed draft from its salvage."""
    from perdure.llm.scripted import ScriptedReply, ScriptedServer

    draft = "A draft long enough to be killed while it streams, then continued. " * 3
    with ScriptedServer(ScriptedReply(text="1. one\n2. two"),
                        ScriptedReply(text=draft, chunk_chars=4, chunk_delay=0.05),
                        ScriptedReply(text=" [the rest]"),
                        ScriptedReply(text="One line.")) as server:
        env = {**_offline_env(), "OPENAI_BASE_URL": server.openai_base_url,
               "OPENAI_API_KEY": "endpoint-key"}
        proc = subprocess.run(
            [sys.executable, "-m", "perdure", "demo", "--llm", "--dir",
             str(tmp_path / "demo"), "--model", "my-model"],
            capture_output=True, text=True, timeout=90, env=env, cwd=tmp_path,
        )
        requests = server.requests
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "(OPENAI_BASE_URL), model my-model" in output
    assert "recorded the recovery: continue" in output
    assert "[the rest]" in output
    assert {r.body["model"] for r in requests} == {"my-model"}
    assert len({r.credential_sha256 for r in requests}) == 1
    stored = b"".join(p.read_bytes() for p in (tmp_path / "demo").glob("demo.db*")
                      if p.is_file())  # (demo.db.wake/ is the wake-up sockets' folder)
    assert stored and b"endpoint-key" not in stored


def test_model_goes_only_with_llm(tmp_path: Path) -> None:
    """``perdure demo --model M`` without ``--llm`` is refused, touching nothing."""
    proc = subprocess.run([sys.executable, "-m", "perdure", "demo", "--model", "m"],
                          capture_output=True, text=True, timeout=60, env=_offline_env(),
                          cwd=tmp_path)
    assert proc.returncode == 1
    assert "--model goes with --llm" in proc.stdout + proc.stderr
    assert list(tmp_path.iterdir()) == []
