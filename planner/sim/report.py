"""The replay report: one self-contained HTML page with inline SVG charts (matplotlib is not installed in this
environment, and a report that needs no plotting library opens anywhere) plus the summary as JSON.

Charts: load (requests/s), replicas per policy, p99 TTFT and p99 ITL per tick per policy, each against time.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from planner.errors import ConfigError

__all__ = ["line_chart_svg", "write_report"]

_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2")
Series = Sequence[tuple[float, float | None]]


def line_chart_svg(
    title: str,
    series: Mapping[str, Series],
    *,
    y_label: str = "",
    width: int = 900,
    height: int = 260,
    step: bool = False,
    log_y: bool = False,
    hline: float | None = None,
) -> str:
    """A small SVG line chart; ``None`` values break the line."""
    pad_l, pad_r, pad_t, pad_b = 60, 150, 28, 34
    pts = [(x, y) for s in series.values() for x, y in s if y is not None and math.isfinite(y)]
    if not pts:
        return f'<svg width="{width}" height="40"><text x="10" y="25">{html.escape(title)}: no data</text></svg>'
    xs = [p[0] for p in pts]
    ys = [p[1] for p in pts] + ([hline] if hline is not None else [])

    def ty(v: float) -> float:
        return math.log10(max(v, 1e-3)) if log_y else v

    x0, x1 = min(xs), max(xs)
    y0 = min(0.0, min(ty(y) for y in ys)) if not log_y else min(ty(y) for y in ys)
    y1 = max(ty(y) for y in ys)
    if x1 <= x0:
        x1 = x0 + 1
    if y1 <= y0:
        y1 = y0 + 1
    w = width - pad_l - pad_r
    h = height - pad_t - pad_b

    def px(x: float) -> float:
        return pad_l + (x - x0) / (x1 - x0) * w

    def py(y: float) -> float:
        return pad_t + h - (ty(y) - y0) / (y1 - y0) * h

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
        f'font-size="11">',
        f'<text x="{pad_l}" y="16" font-size="13">{html.escape(title)}</text>',
        f'<rect x="{pad_l}" y="{pad_t}" width="{w}" height="{h}" fill="none" stroke="#999"/>',
    ]
    for k in range(5):
        yv = y0 + (y1 - y0) * k / 4
        label = 10**yv if log_y else yv
        yy = pad_t + h - h * k / 4
        out.append(f'<text x="{pad_l - 4}" y="{yy + 4:.1f}" text-anchor="end">{label:.3g}</text>')
        out.append(f'<line x1="{pad_l}" x2="{pad_l + w}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#eee"/>')
    for k in range(6):
        xv = x0 + (x1 - x0) * k / 5
        out.append(f'<text x="{px(xv):.1f}" y="{pad_t + h + 14}" text-anchor="middle">{xv / 60:.0f} min</text>')
    out.append(
        f'<text x="12" y="{pad_t + h / 2}" transform="rotate(-90 12 {pad_t + h / 2})" '
        f'text-anchor="middle">{html.escape(y_label)}</text>'
    )
    if hline is not None:
        out.append(
            f'<line x1="{pad_l}" x2="{pad_l + w}" y1="{py(hline):.1f}" y2="{py(hline):.1f}" '
            'stroke="#000" stroke-dasharray="4 3"/>'
        )
    for n, (name, s) in enumerate(series.items()):
        color = _COLORS[n % len(_COLORS)]
        segs: list[list[str]] = [[]]
        prev_y: float | None = None
        for x, y in s:
            if y is None or not math.isfinite(y):
                if segs[-1]:
                    segs.append([])
                prev_y = None
                continue
            if step and prev_y is not None:
                segs[-1].append(f"{px(x):.1f},{py(prev_y):.1f}")
            segs[-1].append(f"{px(x):.1f},{py(y):.1f}")
            prev_y = y
        for seg in segs:
            if seg:
                out.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.3" points="{" ".join(seg)}"/>')
        ly = pad_t + 14 * n + 8
        out.append(f'<rect x="{pad_l + w + 10}" y="{ly - 8}" width="10" height="3" fill="{color}"/>')
        out.append(f'<text x="{pad_l + w + 24}" y="{ly - 3}">{html.escape(name)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return html.escape(str(value))


def write_report(directory: str | Path, result: Mapping[str, Any]) -> Path:
    """Write ``index.html`` and ``replay.json`` into ``directory``; returns the HTML path. ``result`` is the
    replay's JSON document (``policies``, ``timelines``, ``settings``, ``goals``)."""
    root = Path(directory)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create report directory {root}: {exc}") from exc
    policies: Mapping[str, Mapping[str, Any]] = result.get("policies", {})
    timelines: Mapping[str, Sequence[Sequence[Any]]] = result.get("timelines", {})
    settings = result.get("settings", {})
    sla = settings.get("sla", {})
    cols = [
        "sla_attainment",
        "gpu_hours",
        "gpu_hours_vs_oracle",
        "scale_actions",
        "flaps",
        "ttft_p50_ms",
        "ttft_p99_ms",
        "itl_p50_ms",
        "itl_p99_ms",
        "max_replicas",
        "mean_replicas",
    ]
    rows = "".join(
        "<tr><th>" + html.escape(name) + "</th>" + "".join(f"<td>{_fmt(p.get(c))}</td>" for c in cols) + "</tr>"
        for name, p in policies.items()
    )
    table = (
        "<table border=1 cellspacing=0 cellpadding=3><tr><th>policy</th>"
        + "".join(f"<th>{c}</th>" for c in cols)
        + "</tr>"
        + rows
        + "</table>"
    )
    # timeline rows: [at_s, replicas, ready, arrivals_per_s, ttft_p99_ms, itl_p99_ms]
    load = {"requests/s": [(float(r[0]), float(r[3])) for r in next(iter(timelines.values()), [])]}
    replicas = {n: [(float(r[0]), float(r[1])) for r in tl] for n, tl in timelines.items()}
    ttft = {n: [(float(r[0]), None if r[4] is None else float(r[4])) for r in tl] for n, tl in timelines.items()}
    itl = {n: [(float(r[0]), None if r[5] is None else float(r[5])) for r in tl] for n, tl in timelines.items()}
    charts = [
        line_chart_svg("Load (arrivals per second, per tick)", load, y_label="req/s"),
        line_chart_svg("Replicas holding GPUs", replicas, y_label="replicas", step=True),
        line_chart_svg(
            "p99 TTFT of requests arriving in each tick (log scale)",
            ttft,
            y_label="ms",
            log_y=True,
            hline=sla.get("ttft_ms"),
        ),
        line_chart_svg("p99 ITL of requests arriving in each tick", itl, y_label="ms", hline=sla.get("itl_ms")),
    ]
    doc = (
        "<!doctype html><html><head><meta charset='utf-8'><title>fpm-planner replay</title></head><body>"
        f"<h1>Replay: {html.escape(str(result.get('trace', {}).get('name', '')))}</h1>"
        f"<p><code>{html.escape(str(result.get('command', '')))}</code></p>"
        f"{table}<h2>Goals</h2><pre>{html.escape(json.dumps(result.get('goals', {}), indent=2))}</pre>"
        + "".join(f"<div>{c}</div>" for c in charts)
        + f"<h2>Settings</h2><pre>{html.escape(json.dumps(settings, indent=2, default=str))}</pre></body></html>"
    )
    path = root / "index.html"
    path.write_text(doc)
    (root / "replay.json").write_text(json.dumps(result, indent=1, default=str))
    return path
