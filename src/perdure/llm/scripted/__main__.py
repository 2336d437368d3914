"""``python -m perdure.llm.scripted``: run the scripted model server until interrupted."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from perdure.llm.scripted import ScriptedServer, load_script


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, print the base URLs, serve until Ctrl-C."""
    parser = argparse.ArgumentParser(
        prog="python -m perdure.llm.scripted",
        description="A local model server speaking Chat Completions, Responses and "
                    "Anthropic Messages, answering from a script (then echoing).")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=0, help="port (0: a free one)")
    parser.add_argument("--script", type=Path,
                        help="JSON list of steps: {'reply': {...}} or {'failure': {...}}")
    parser.add_argument("--tokens-per-minute", type=int,
                        help="enforce a token quota: answer 429 with retry-after past it")
    parser.add_argument("--quota-window", type=float, default=60.0,
                        help="seconds the quota is counted over (default 60)")
    args = parser.parse_args(argv)
    steps = load_script(args.script.read_text()) if args.script else []
    server = ScriptedServer(*steps, host=args.host, port=args.port,
                            tokens_per_minute=args.tokens_per_minute,
                            quota_window=args.quota_window)
    print(f"openai base url:    {server.openai_base_url}", flush=True)
    print(f"anthropic base url: {server.anthropic_base_url}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
