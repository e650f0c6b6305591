"""The report page's plots as plain SVG text: latency bars on a log axis, the INT8 search, calibration ranges
against the declared input range, error histograms.

Drawn here rather than with matplotlib because a cold build paid 1.3 s for it on a 2-core host (0.8 s to
import it, 0.5 s to lay out and write four figures), against milliseconds for these few paths and labels;
the page needs no optional package for its plots. Every text that comes from the report (output and backend
names, input names) is XML-escaped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any
from xml.sax.saxutils import escape

FONT = "font-family='DejaVu Sans, Arial, sans-serif'"
CYCLE = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860")


def _nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round ticks (1, 2 or 5 times a power of ten apart) covering ``lo .. hi``."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo]
    raw = (hi - lo) / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    ticks, v = [], first
    while v <= hi + step * 1e-9:
        ticks.append(round(v, 12))
        v += step
    return ticks


def _tick_label(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1e4 or abs(v) < 1e-3:
        return f"{v:.0e}"
    return f"{v:g}"


class Axes:
    """One plotting area in an SVG of ``width`` x ``height`` pixels, with linear or log data axes."""

    def __init__(self, width: int, height: int, title: str, *, left: int = 64, right: int = 24, bottom: int = 44):
        self.width, self.height = width, height
        self.x0, self.x1 = left, width - right
        self.y0, self.y1 = height - bottom, 30  # y grows upwards in data space
        self.xlim = (0.0, 1.0)
        self.ylim = (0.0, 1.0)
        self.xlog = False
        self.parts: list[str] = [
            f"<text x='{width / 2:.1f}' y='18' text-anchor='middle' font-size='13' {FONT}>{escape(title)}</text>"
        ]

    def set_x(self, lo: float, hi: float, *, log: bool = False) -> None:
        self.xlog = log
        self.xlim = (math.log10(lo), math.log10(hi)) if log else (lo, hi if hi > lo else lo + 1)

    def set_y(self, lo: float, hi: float) -> None:
        """Data range from the bottom edge to the top (``lo > hi`` turns the axis upside down)."""
        self.ylim = (lo, hi if hi != lo else lo + 1)

    def px(self, x: float) -> float:
        v = math.log10(x) if self.xlog else x
        lo, hi = self.xlim
        return self.x0 + (v - lo) / (hi - lo) * (self.x1 - self.x0)

    def py(self, y: float, ylim: tuple[float, float] | None = None) -> float:
        lo, hi = ylim or self.ylim
        return self.y0 - (y - lo) / (hi - lo) * (self.y0 - self.y1)

    def path(self, points: Sequence[tuple[float, float]], colour: str, *, width: float = 1.5, dash: str = "",
             fill: str = "none", opacity: float = 1.0, close: bool = False) -> None:  # fmt: skip
        """A polyline through pixel ``points``."""
        if not points:
            return
        d = "M" + " L".join(f"{x:.1f},{y:.1f}" for x, y in points) + (" Z" if close else "")
        extra = f" stroke-dasharray='{dash}'" if dash else ""
        extra += f" opacity='{opacity:g}'" if opacity < 1 else ""
        self.parts.append(f"<path d='{d}' stroke='{colour}' stroke-width='{width:g}' fill='{fill}'{extra}/>")

    def box(self, x_lo: float, x_hi: float, y_lo: float, y_hi: float, colour: str) -> None:
        """A filled rectangle between pixel corners."""
        self.path([(x_lo, y_lo), (x_hi, y_lo), (x_hi, y_hi), (x_lo, y_hi)], colour, width=0, fill=colour, close=True)

    def marker(self, x: float, y: float, shape: str, colour: str, *, hollow: bool = False, size: float = 4.5) -> None:
        fill = "white" if hollow else colour
        if shape == "circle":
            self.parts.append(
                f"<circle cx='{x:.1f}' cy='{y:.1f}' r='{size:g}' stroke='{colour}' stroke-width='1.5' fill='{fill}'/>"
            )
        elif shape == "square":
            self.box(x - size * 0.7, x + size * 0.7, y - size * 0.7, y + size * 0.7, colour)
        else:  # star
            points = []
            for k in range(10):
                r = size * (2.2 if k % 2 == 0 else 0.9)
                a = math.pi / 2 + k * math.pi / 5
                points.append((x + r * math.cos(a), y - r * math.sin(a)))
            self.path(points, colour, width=0.5, fill=colour, close=True)

    def text(self, x: float, y: float, s: str, *, size: float = 10, anchor: str = "middle", colour: str = "#222",
             rotate: bool = False) -> None:  # fmt: skip
        turn = f" transform='rotate(-90 {x:.1f} {y:.1f})'" if rotate else ""
        self.parts.append(
            f"<text x='{x:.1f}' y='{y:.1f}' text-anchor='{anchor}' font-size='{size}' fill='{colour}' {FONT}{turn}>"
            f"{escape(s)}</text>"
        )

    def frame(self, xlabel: str, ylabel: str, *, xticks: bool = True) -> None:
        """The axes box, x ticks (decades on a log axis) and both labels."""
        self.path([(self.x0, self.y1), (self.x0, self.y0), (self.x1, self.y0), (self.x1, self.y1)], "#333",
                  width=1, close=True)  # fmt: skip
        if xticks:
            lo, hi = self.xlim
            if self.xlog:
                values = [10.0**k for k in range(math.ceil(lo - 1e-9), math.floor(hi + 1e-9) + 1)]
                if len(values) < 2:
                    values = [v * 10.0**k for k in range(math.floor(lo), math.ceil(hi) + 1) for v in (1, 2, 5)]
                    values = [v for v in values if lo - 1e-9 <= math.log10(v) <= hi + 1e-9]
            else:
                values = _nice_ticks(lo, hi)
            for v in values:
                x = self.px(v)
                self.path([(x, self.y0), (x, self.y0 + 4)], "#333", width=1)
                self.text(x, self.y0 + 15, _tick_label(v), size=9)
        self.text((self.x0 + self.x1) / 2, self.y0 + 32, xlabel, size=10)
        self.text(13, (self.y0 + self.y1) / 2, ylabel, size=10, rotate=True)

    def yticks(self, ylim: tuple[float, float] | None = None, *, right: bool = False) -> None:
        lo, hi = ylim or self.ylim
        for v in _nice_ticks(lo, hi):
            y = self.py(v, ylim)
            x = self.x1 if right else self.x0
            self.path([(x, y), (x + (4 if right else -4), y)], "#333", width=1)
            self.text(x + (6 if right else -6), y + 3, _tick_label(v), size=9, anchor="start" if right else "end")

    def legend(self, items: Sequence[tuple[str, str, str]], x: float, y: float) -> None:
        """Rows of (kind, colour, label) from pixel (x, y): kind is line, dash, box, circle, hollow, star or square."""
        for i, (kind, colour, label) in enumerate(items):
            cy = y + 13 * i
            if kind in ("line", "dash"):
                self.path([(x, cy), (x + 16, cy)], colour, width=2, dash="4,3" if kind == "dash" else "")
            elif kind == "box":
                self.box(x, x + 16, cy - 4, cy + 4, colour)
            else:
                shape = {"hollow": "circle"}.get(kind, kind)
                self.marker(x + 8, cy, shape, colour, hollow=kind == "hollow", size=3.5 if kind != "star" else 2.6)
            self.text(x + 21, cy + 3.5, label, size=8.5, anchor="start")

    def svg(self) -> str:
        return (
            f"<svg xmlns='http://www.w3.org/2000/svg' width='{self.width}' height='{self.height}' "
            f"viewBox='0 0 {self.width} {self.height}' role='img'>"
            f"<rect width='100%' height='100%' fill='white'/>{''.join(self.parts)}</svg>"
        )


def histogram_svg(output: str, hists: list[tuple[str, dict[str, Any]]]) -> str:
    """Each candidate's error histogram (counts over log10 |candidate - PyTorch| bins) as steps."""
    ax = Axes(620, 320, f"error histogram: {output}", left=64)
    edges = [e for _, h in hists for e in h["edges"]] or [0.0, 1.0]
    top = max([c for _, h in hists for c in h["counts"]] or [1])
    ax.set_x(min(edges), max(edges))
    ax.set_y(0, top * 1.1)
    legend = []
    for i, (name, hist) in enumerate(hists):
        colour = CYCLE[i % len(CYCLE)]
        points = [(ax.px(hist["edges"][0]), ax.py(0))]
        for lo, hi, count in zip(hist["edges"], hist["edges"][1:], hist["counts"]):
            points += [(ax.px(lo), ax.py(count)), (ax.px(hi), ax.py(count))]
        points.append((ax.px(hist["edges"][-1]), ax.py(0)))
        ax.path(points, colour)
        total = sum(hist["counts"]) + hist.get("exact", 0)
        label = f"{name} ({hist.get('exact', 0)} exact of {total}"
        label += f", {hist['non_finite']} NaN/Inf)" if hist.get("non_finite") else ")"
        legend.append(("line", colour, label))
    ax.frame("log10 |candidate - PyTorch|", "values")
    ax.yticks()
    ax.legend(legend, ax.x0 + 8, ax.y1 + 12)
    return ax.svg()


def latency_svg(backends: dict[str, dict[str, Any]]) -> tuple[str, str]:
    """Horizontal p50 bars with p90 / p99 ticks on a log axis (a 2 s p99 beside 0.03 ms bars keeps both
    readable); returns the SVG and the axis scale."""
    names = list(backends)
    values = [backends[n][k] for n in names for k in ("p50_ms", "p90_ms", "p99_ms") if backends[n].get(k)]
    positive = [v for v in values if v > 0] or [1.0]
    floor, ceiling = min(positive) / 3, max(positive) * 2
    label_width = max(len(n) for n in names) * 6 + 12
    ax = Axes(640, 70 + 30 * len(names), "latency", left=label_width, right=90)
    ax.set_x(floor, ceiling, log=True)
    ax.set_y(len(names) - 0.4, -0.6)  # first backend on top
    for i, n in enumerate(names):
        row = backends[n]
        y = ax.py(i)
        if row.get("p50_ms"):
            ax.box(ax.px(floor), ax.px(max(row["p50_ms"], floor)), y - 9, y + 9, "#4c72b0")
            ax.text(ax.px(max(row["p50_ms"], floor)) + 4, y + 16, f"{row['p50_ms']:.3g} ms", size=8, anchor="start")
        for key, colour in (("p90_ms", "#dd8452"), ("p99_ms", "#c44e52")):
            if row.get(key) and row[key] > 0:
                x = ax.px(row[key])
                ax.path([(x, y - 11), (x, y + 11)], colour, width=2.5)
        ax.text(ax.x0 - 6, y + 3, n, size=9, anchor="end")
    ax.frame("milliseconds per batch (log scale)", "")
    items = [("box", "#4c72b0", "p50"), ("line", "#dd8452", "p90"), ("line", "#c44e52", "p99")]
    ax.legend(items, ax.x1 + 10, ax.y1 + 6)
    return ax.svg(), "log"


def search_svg(tries: list[dict[str, Any]], target: float | None, shipped: int | None) -> str:
    """Agreement per try (left axis, with the target) and each try's p50 (right axis)."""
    ax = Axes(640, 340, "INT8 float-fallback search", right=64, bottom=48)
    scores = [t["score"] for t in tries] + ([target] if target is not None else [])
    lo, hi = min(scores), max(scores)
    pad = max((hi - lo) * 0.12, 0.005)
    ax.set_x(0.5, len(tries) + 0.5)
    ax.set_y(lo - pad, hi + pad)
    x = {t["try"]: ax.px(i + 1) for i, t in enumerate(tries)}
    timed = [t for t in tries if t.get("p50_ms")]
    speed_lim = (0.0, max([t["p50_ms"] for t in timed] or [1.0]) * 1.15)
    if timed:
        ax.path([(x[t["try"]], ax.py(t["p50_ms"], speed_lim)) for t in timed], "#4c72b0", width=1, dash="2,3")
        for t in timed:
            ax.marker(x[t["try"]], ax.py(t["p50_ms"], speed_lim), "square", "#4c72b0", size=3.5)
        ax.yticks(speed_lim, right=True)
        ax.text(ax.width - 10, (ax.y0 + ax.y1) / 2, "ONNX Runtime p50 ms (right)", size=10, rotate=True)
    if target is not None:
        ax.path([(ax.x0, ax.py(target)), (ax.x1, ax.py(target))], "#cf222e", width=1, dash="5,4")
    ax.path([(x[t["try"]], ax.py(t["score"])) for t in tries], "#999999", width=0.8)
    for t in tries:
        px, py = x[t["try"]], ax.py(t["score"])
        ax.marker(px, py, "circle", "#1a7f37" if t.get("met") else "#cf222e", hollow=not t.get("met"))
        label = f"{t['float_nodes']}" + ({"sensitivity": "s", "prefix": "p"}.get(t.get("family", ""), ""))
        ax.text(px, py - 9, label, size=8)
    chosen = [t for t in tries if shipped is not None and t["try"] == shipped]
    if chosen:
        ax.marker(x[chosen[0]["try"]], ax.py(chosen[0]["score"]), "star", "#9a6700", size=4)
    for i, t in enumerate(tries):
        ax.path([(ax.px(i + 1), ax.y0), (ax.px(i + 1), ax.y0 + 4)], "#333", width=1)
        ax.text(ax.px(i + 1), ax.y0 + 15, str(t["try"]), size=9)  # precision.json's numbers: try 0, all INT8
    ax.frame("try (label: float nodes, s = sensitivity, p = prefix family)", str(tries[0].get("metric", "score")),
             xticks=False)  # fmt: skip
    ax.yticks()
    items = [("circle", "#1a7f37", "meets"), ("hollow", "#cf222e", "misses / vetoed")]
    items += [("star", "#9a6700", "shipped")] if chosen else []
    items += [("dash", "#cf222e", f"target {target:g}")] if target is not None else []
    items += [("square", "#4c72b0", "p50 ms")] if timed else []
    ax.legend(items, ax.x1 - 120, ax.y0 - 13 * len(items) - 2)
    return ax.svg()


def ranges_svg(ranges: dict[str, dict[str, Any]]) -> str:
    """Per input: the declared range (light band), the calibration min..max (thin) and 1st..99th percentile
    (thick), red where the data leaves the declared range."""
    names = list(ranges)
    label_width = max(len(n) for n in names) * 6 + 14
    ax = Axes(640, 100 + 34 * len(names), "calibration data vs declared input range", left=label_width, bottom=62)
    ends = [v for r in ranges.values() for key in ("declared", "data") for v in r[key]]
    lo, hi = min(ends), max(ends)
    pad = (hi - lo) * 0.05 or 0.5
    ax.set_x(lo - pad, hi + pad)
    ax.set_y(len(names) - 0.3, -0.7)
    for i, name in enumerate(names):
        r = ranges[name]
        y = ax.py(i)
        d_lo, d_hi = r["declared"]
        ax.box(ax.px(d_lo), ax.px(d_hi), y - 11, y + 11, "#d0e4f5")
        colour = "#cf222e" if r.get("outside") else "#1f4e79"
        c_lo, c_hi = r["data"]
        ax.path([(ax.px(c_lo), y), (ax.px(c_hi), y)], colour, width=2)
        if r.get("data_p1_p99"):
            p_lo, p_hi = r["data_p1_p99"]
            ax.path([(ax.px(p_lo), y), (ax.px(p_hi), y)], colour, width=7, opacity=0.6)
        ax.text(ax.x0 - 6, y + 3, name, size=9, anchor="end")
    ax.frame("input value", "")
    items = [("box", "#d0e4f5", "declared inputs.range"), ("line", "#1f4e79", "calibration min..max"),
             ("line", "#1f4e79", "calibration 1st..99th pct (thick)")]  # fmt: skip
    for i, (kind, colour, label) in enumerate(items):
        ax.legend([(kind, colour, label)], ax.x0 + 190 * i, ax.height - 14)
    return ax.svg()
