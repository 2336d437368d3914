"""Golden log files: one object's recorded memory as JSON, and back to ``Record`` objects.

A golden file holds the object's id, agent, version, status when recorded, the
public keys of the nodes that signed it, and every record with all its fields
(body as JSON, signature as hex). ``load_log`` rebuilds the records exactly:
the body bytes are the canonical encoding of the body, so hashes and signatures
still verify.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perdure.core.codec import encode
from perdure.core.records import Record, decode_record

__all__ = ["FORMAT", "GOLDEN_DIR", "GoldenLog", "golden_files", "load_log", "log_to_json"]

FORMAT = 1
GOLDEN_DIR = Path(__file__).resolve().parent


@dataclass(frozen=True)
class GoldenLog:
    """One golden file, loaded: what was recorded about the object, and its memory."""

    path: Path
    object_id: str
    agent: str
    version: str
    status: str
    public_keys: dict[str, bytes]
    records: list[Record]


def golden_files(folder: Path = GOLDEN_DIR) -> list[Path]:
    """Every golden log file in ``folder``, sorted by name."""
    return sorted(folder.glob("*.json"))


def log_to_json(*, object_id: str, agent: str, version: str, status: str,
                public_keys: Mapping[str, bytes], records: Sequence[Record],
                recorded_with: str) -> str:
    """The golden file text for one object's memory."""
    doc: dict[str, Any] = {
        "format": FORMAT,
        "recorded_with": recorded_with,
        "object_id": object_id,
        "agent": agent,
        "version": version,
        "status": status,
        "public_keys": {node: key.hex() for node, key in sorted(public_keys.items())},
        "records": [
            {
                "seq": rec.seq,
                "kind": str(rec.kind),
                "body": rec.body,
                "trace_id": rec.trace_id,
                "ts_us": rec.ts_us,
                "node_id": rec.node_id,
                "policy_ref": rec.policy_ref,
                "prev_hash": rec.prev_hash,
                "hash": rec.hash,
                "signature": rec.signature.hex(),
            }
            for rec in records
        ],
    }
    return json.dumps(doc, indent=1, ensure_ascii=False) + "\n"


def load_log(path: Path) -> GoldenLog:
    """Read a golden file and rebuild its ``Record`` objects."""
    doc = json.loads(path.read_text(encoding="utf-8"))
    if doc.get("format") != FORMAT:
        raise ValueError(f"{path.name}: golden format {doc.get('format')!r}, expected {FORMAT}")
    object_id = str(doc["object_id"])
    records = [
        decode_record(
            object_id=object_id,
            seq=int(item["seq"]),
            trace_id=str(item["trace_id"]),
            ts_us=int(item["ts_us"]),
            node_id=str(item["node_id"]),
            policy_ref=str(item["policy_ref"]),
            kind=str(item["kind"]),
            body_bytes=encode(item["body"]),
            prev_hash=str(item["prev_hash"]),
            hash=str(item["hash"]),
            signature=bytes.fromhex(item["signature"]),
        )
        for item in doc["records"]
    ]
    return GoldenLog(
        path=path,
        object_id=object_id,
        agent=str(doc["agent"]),
        version=str(doc["version"]),
        status=str(doc["status"]),
        public_keys={node: bytes.fromhex(key) for node, key in doc["public_keys"].items()},
        records=records,
    )
