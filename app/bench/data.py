"""Evaluation data: JSONL files beside the checkout in ../shared/data, or a path given."""
from __future__ import annotations

import json
from pathlib import Path

DEFAULT_DATA_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data"


def read_jsonl(path: Path, limit: int | None = None) -> list[dict]:
    if not path.is_file():
        raise FileNotFoundError(f"data file not found: {path} (give another with --data)")
    rows = []
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            if line.strip():
                rows.append(json.loads(line))
            if limit is not None and len(rows) >= limit:
                break
    return rows
