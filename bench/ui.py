"""The dashboard's objects list at scale, on SQLite: page latency at 100,000 objects.

A few hundred real objects are started with ``App.start`` (three agents, two labels);
the store is then filled up to ``objects`` rows by copying their ``objects`` rows and
first records with SQL (new ids, creation times spread over a day, a mix of statuses),
so that the list reads what it would read on a store of that size. Then, for each
query, ``pages`` pages of 50 are read through ``perdure.web._queries.Queries`` (what the
dashboard runs) and timed: the first page, pages deep into the list (following the
cursor), a status filter, an agent filter, a label filter, an id search; and the whole
``GET /objects`` page over HTTP (Starlette's test client: the guard, the query, the
HTML). Figures: median and 95th percentile milliseconds, against a floor of
``floor_ms`` for the median (PASS/FAIL).
"""

from __future__ import annotations

import re
import sqlite3
import statistics
import time
from pathlib import Path
from typing import Any

import perdure

__all__ = ["FULL", "QUICK", "measure", "table"]

QUICK = {"objects": 5_000, "real": 100, "pages": 10, "floor_ms": 100.0}
FULL = {"objects": 100_000, "real": 300, "pages": 40, "floor_ms": 100.0}


def _app(url: str, key_dir: Path) -> perdure.App:
    app = perdure.App(store=url, key_dir=key_dir, node_id="bench-ui")

    @app.agent(name="writer")
    def writer(run: perdure.SyncRun, n: int) -> int:
        return n

    @app.agent(name="reviewer")
    def reviewer(run: perdure.SyncRun, n: int) -> int:
        return n

    @app.agent(name="planner")
    def planner(run: perdure.SyncRun, n: int) -> int:
        return n

    return app


def _fill(path: Path, real: list[str], objects: int) -> None:
    """Copy the real objects' rows and first records up to ``objects`` rows."""
    conn = sqlite3.connect(path)
    try:
        cols = [r[1] for r in conn.execute("PRAGMA table_info(objects)")]
        rcols = [r[1] for r in conn.execute("PRAGMA table_info(records)")]
        statuses = ["completed", "completed", "completed", "dormant", "failed", "ready"]
        now = time.time()
        conn.execute("BEGIN")
        made = len(real)
        n = 0
        while made < objects:
            source = real[n % len(real)]
            new = f"copy-{n:07d}"
            at = now - 86_400 + 86_400 * made / objects
            values = {c: c for c in cols}
            values.update(object_id="?", status="?", created_at="?", updated_at="?")
            conn.execute(
                f"INSERT INTO objects ({', '.join(cols)}) SELECT "
                + ", ".join(values[c] for c in cols) + " FROM objects WHERE object_id = ?",
                (new, statuses[n % len(statuses)], at, at, source))
            rvalues = {c: c for c in rcols}
            rvalues["object_id"] = "?"
            conn.execute(
                f"INSERT INTO records ({', '.join(rcols)}) SELECT "
                + ", ".join(rvalues[c] for c in rcols)
                + " FROM records WHERE object_id = ? AND seq = 1", (new, source))
            made += 1
            n += 1
        conn.execute("COMMIT")
        conn.execute("ANALYZE")
    finally:
        conn.close()


def _timed(fn: Any, repeats: int) -> dict[str, float]:
    took = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        took.append((time.perf_counter() - t0) * 1000)
    took.sort()
    return {"median_ms": round(statistics.median(took), 2),
            "p95_ms": round(took[min(len(took) - 1, int(len(took) * 0.95))], 2)}


def measure(folder: Path, sizes: dict[str, Any]) -> dict[str, Any]:
    """Fill a SQLite store to ``sizes["objects"]`` objects and time the list's pages."""
    from starlette.testclient import TestClient

    from perdure import web
    from perdure.web._queries import Filters, Queries

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "ui.db"
    url = f"sqlite:///{path}"
    app = _app(url, folder / "keys")
    real = []
    for n in range(sizes["real"]):
        agent = ("writer", "reviewer", "planner")[n % 3]
        real.append(app.options(labels={"team": "red" if n % 2 else "blue"}).start(
            agent, n).object_id)
    app.close()
    _fill(path, real, sizes["objects"])
    app = _app(url, folder / "keys")
    queries = Queries(app.store)
    pages = sizes["pages"]
    figures: dict[str, Any] = {"objects": sizes["objects"], "page_size": 50}
    state: dict[str, Any] = {"cursor": None}

    def deep() -> None:
        page = queries.page(Filters(), cursor=state["cursor"], limit=50)
        state["cursor"] = page.next_cursor

    cases = {
        "first_page": lambda: queries.page(Filters(), limit=50),
        "deep_pages": deep,
        "status": lambda: queries.page(Filters(status="completed"), limit=50),
        "agent": lambda: queries.page(Filters(agent="reviewer"), limit=50),
        "label": lambda: queries.page(Filters(label="team=red"), limit=50),
        "id_search": lambda: queries.page(Filters(q="copy-00123"), limit=50),
    }
    for name, fn in cases.items():
        fn()  # warm
        figures[name] = _timed(fn, pages)
    asgi, tokens = web.dashboard(app, port=8377)
    with TestClient(asgi, base_url="http://127.0.0.1:8377") as client:  # type: ignore[arg-type]
        form = client.get("/login").text
        found = re.search(r'name="csrf" value="([^"]+)"', form)
        assert found is not None
        client.post("/login", data={"csrf": found.group(1), "name": "bench",
                                    "secret": tokens["operator"]})
        assert client.get("/objects").status_code == 200
        figures["http_page"] = _timed(lambda: client.get("/objects?status=completed"), pages)
    app.close()
    floor = float(sizes["floor_ms"])
    worst = max(v["median_ms"] for k, v in figures.items() if isinstance(v, dict))
    figures["floor_ms"] = floor
    figures["worst_median_ms"] = worst
    figures["verdict"] = "PASS" if worst <= floor else "FAIL"
    return figures


_LABELS = {"first_page": "first page", "deep_pages": "pages deep into the list (by cursor)",
           "status": "status = completed", "agent": "agent = reviewer",
           "label": "label team=red", "id_search": "id starting copy-00123",
           "http_page": "GET /objects?status=completed over HTTP (whole page)"}


def table(report: dict[str, Any]) -> str:
    """The ``ui`` figures as a Markdown table (``""`` when the part did not run)."""
    figures = report.get("ui")
    if not figures:
        return ""
    rows = [f"| {_LABELS[k]} | {v['median_ms']:g} ms | {v['p95_ms']:g} ms |"
            for k, v in figures.items() if k in _LABELS]
    return ("| page of 50 at {:,} objects (SQLite) | median | p95 |\n| --- | --- | --- |\n"
            .format(figures["objects"]) + "\n".join(rows)
            + f"\n\nfloor {figures['floor_ms']:g} ms for the worst median: "
            f"**{figures['verdict']}**\n")
