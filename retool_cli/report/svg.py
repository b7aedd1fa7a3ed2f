"""Line charts as inline SVG, drawn here so that the report needs no plotting library in the browser and no
network: per-seed lines faint, their mean bold, and error bars where a point has an interval."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from html import escape

PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"]
WIDTH, HEIGHT = 380, 230
LEFT, RIGHT, TOP, BOTTOM = 52, 12, 26, 34  # margins around the plot area


@dataclass
class Series:
    label: str
    points: list[tuple[float, float]]  # (x, y), x ascending
    color: str
    faint: bool = False  # a single seed drawn under its setting's mean
    errors: list[tuple[float, float, float]] = field(default_factory=list)  # (x, low, high)


def line_chart(
    title: str,
    series: list[Series],
    x_label: str = "step",
    y_range: tuple | None = None,
    x_names: list[str] | None = None,
) -> str:
    """One chart; an empty one says that there is nothing to draw. `x_names`: the x axis is categorical, the
    name of position i at x = i."""
    drawn = [s for s in series if s.points]
    if not drawn:
        return f'<figure class="chart"><figcaption>{escape(title)}</figcaption><p class="empty">no data</p></figure>'
    xs = [x for s in drawn for x, _ in s.points]
    ys = [y for s in drawn for _, y in s.points] + [v for s in drawn for _, lo, hi in s.errors for v in (lo, hi)]
    x0, x1 = _span(min(xs), max(xs)) if not x_names else (-0.5, len(x_names) - 0.5)
    y0, y1 = y_range or _span(min(ys), max(ys))

    def px(x: float) -> float:
        return LEFT + (x - x0) / (x1 - x0) * (WIDTH - LEFT - RIGHT)

    def py(y: float) -> float:
        return HEIGHT - BOTTOM - (min(max(y, y0), y1) - y0) / (y1 - y0) * (HEIGHT - TOP - BOTTOM)

    parts = [f'<text x="{LEFT}" y="16" class="title">{escape(title)}</text>']
    for tick in _ticks(y0, y1):
        parts.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{py(tick):.1f}" y2="{py(tick):.1f}" class="grid"/>')
        parts.append(f'<text x="{LEFT - 4}" y="{py(tick) + 3:.1f}" class="tick" text-anchor="end">{_fmt(tick)}</text>')
    whole = all(float(x).is_integer() for x in xs)  # steps: no tick between two steps
    x_ticks = list(enumerate(x_names)) if x_names else [(t, _fmt(t)) for t in _ticks(x0, x1, whole=whole)]
    for tick, name in x_ticks:
        where = f'x="{px(tick):.1f}" y="{HEIGHT - BOTTOM + 14}"'
        parts.append(f'<text {where} class="tick" text-anchor="middle">{escape(name)}</text>')
    parts.append(f'<text x="{WIDTH - RIGHT}" y="{HEIGHT - 4}" class="tick" text-anchor="end">{escape(x_label)}</text>')
    for s in sorted(drawn, key=lambda s: not s.faint):  # faint lines underneath
        path = " ".join(f"{'M' if i == 0 else 'L'}{px(x):.1f},{py(y):.1f}" for i, (x, y) in enumerate(s.points))
        width, opacity = (1.0, 0.35) if s.faint else (2.0, 1.0)
        parts.append(
            f'<path d="{path}" fill="none" stroke="{s.color}" stroke-width="{width}" opacity="{opacity}">'
            f"<title>{escape(s.label)}</title></path>"
        )
        if len(s.points) == 1 or s.errors:
            for x, y in s.points:
                parts.append(
                    f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.5" fill="{s.color}" opacity="{opacity}"/>'
                )
        for x, lo, hi in s.errors:
            parts.append(
                f'<line x1="{px(x):.1f}" x2="{px(x):.1f}" y1="{py(lo):.1f}" y2="{py(hi):.1f}" '
                f'stroke="{s.color}" stroke-width="1.2"/>'
            )
    legend = "".join(
        f'<span class="key{" faint" if s.faint else ""}"><i style="background:{s.color}"></i>{escape(s.label)}</span>'
        for s in drawn
        if not s.faint
    )
    svg = f'<svg viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img">{"".join(parts)}</svg>'
    return f'<figure class="chart">{svg}<figcaption>{legend}</figcaption></figure>'


def _span(low: float, high: float) -> tuple[float, float]:
    if high - low < 1e-12:
        pad = abs(low) * 0.1 or 1.0
        return low - pad, high + pad
    return low, high


def _ticks(low: float, high: float, count: int = 4, whole: bool = False) -> list[float]:
    """Round tick values inside [low, high] (whole numbers only, with `whole`)."""
    raw = (high - low) / count
    step = 10 ** math.floor(math.log10(raw))
    step *= next(m for m in (1, 2, 2.5, 5, 10) if m * step >= raw)
    if whole:
        step = max(1, round(step))
    first = math.ceil(low / step) * step
    return [first + i * step for i in range(int((high - first) / step) + 1)]


def _fmt(value: float) -> str:
    if value == int(value) and abs(value) < 1e6:
        return str(int(value))
    if value != 0 and (abs(value) >= 1e4 or abs(value) < 1e-2):
        return f"{value:.0e}"
    return f"{value:.3g}"
