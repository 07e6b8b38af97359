"""The metric names a PromQL expression reads (enough of PromQL for dashboard queries)."""
from __future__ import annotations

import json
import re
from pathlib import Path

DASHBOARD = Path(__file__).resolve().parent.parent / "deploy" / "grafana" / "dashboards" / "packyard.json"
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset"}


def metric_names(expr: str) -> set[str]:
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)                   # string literals
    e = re.sub(r"\{[^}]*\}", "", e)                                   # label matchers
    e = re.sub(r"\[[^\]]*\]", "", e)                                  # range selectors
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", e)
    names = set()
    for m in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", e):
        word = m.group(0)
        if word in _KEYWORDS or e[m.end():].lstrip().startswith("("):   # a function or an aggregation
            continue
        names.add(word)
    return names


def dashboard_exprs(path: Path = DASHBOARD) -> list[str]:
    doc = json.loads(path.read_text())
    return [t["expr"] for p in doc["panels"] for t in p.get("targets", []) if t.get("expr")]


def dashboard_metrics(prefix: str, path: Path = DASHBOARD) -> set[str]:
    return {n for e in dashboard_exprs(path) for n in metric_names(e) if n.startswith(prefix)}


def served(name: str, families: dict[str, str]) -> bool:
    """Is ``name`` (as a query names it) a series of one of ``families`` ({family name: type})?"""
    if name in families:
        return True
    for suffix, kinds in (("_bucket", {"histogram"}), ("_sum", {"histogram", "summary"}),
                          ("_count", {"histogram", "summary"}), ("_total", {"counter"})):
        if name.endswith(suffix) and families.get(name[: -len(suffix)]) in kinds:
            return True
    return False
