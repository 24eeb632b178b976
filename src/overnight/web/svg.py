"""Server-rendered SVG charts for the dashboard: the branch graph and the storage growth chart.

Built with :mod:`xml.etree.ElementTree`, which escapes every text and attribute value, so a
branch or task name with markup in it is drawn as text. No script, no inline style (the pages'
Content-Security-Policy forbids both): colours are presentation attributes.
"""

from __future__ import annotations

from typing import Any
from xml.etree import ElementTree as ET

from overnight.units import human_bytes as _human
from overnight.web.text import bidi_visible

PALETTE = ("#2563eb", "#d97706", "#059669", "#db2777", "#7c3aed", "#0891b2", "#65a30d", "#dc2626")
"""Lane colours, by lane index modulo their number (the timeline's branch dots use the same)."""


def lane_colour(lane: int) -> str:
    """The colour of branch lane ``lane``."""
    return PALETTE[lane % len(PALETTE)]


def _svg(width: int, height: int, label: str) -> ET.Element:
    return ET.Element("svg", {"xmlns": "http://www.w3.org/2000/svg", "viewBox": f"0 0 {width} {height}",
                              "width": "100%", "role": "img", "aria-label": label,
                              "preserveAspectRatio": "xMinYMin meet"})


def branch_graph(graph: dict[str, Any], *, width: int = 1000) -> str:
    """The chain of a task as lanes (one per branch, seq along x), fork and merge connectors,
    session bands (alternating shade) and compaction ticks, from ``queries.task_page()["graph"]``.
    Its size does not grow with the number of checkpoints: one segment per branch."""
    lanes = graph["lanes"]
    lane_h, top, left, right = 26, 22, 110, 16
    height = top + lane_h * max(1, len(lanes)) + 10
    span = max(1, graph["max_seq"])
    x_of = lambda seq: left + (width - left - right) * (seq / span)  # noqa: E731
    y_of = lambda lane: top + lane_h * lane + lane_h / 2  # noqa: E731
    svg = _svg(width, height, f"branch graph: {len(lanes)} branch(es), seq 0..{graph['max_seq']}")
    for i, band in enumerate(graph["sessions"]):
        x0, x1 = x_of(band["from"]), x_of(band["to"])
        rect = ET.SubElement(svg, "rect", {"x": f"{x0 - 2:.1f}", "y": "2", "width": f"{max(4.0, x1 - x0 + 4):.1f}",
                                           "height": str(height - 4), "fill": "#94a3b8" if i % 2 else "#cbd5e1",
                                           "fill-opacity": "0.25"})
        ET.SubElement(rect, "title").text = f"session {band['session']}: seq {band['from']}..{band['to']}"
    for seq in graph["compactions"]:
        line = ET.SubElement(svg, "line", {"x1": f"{x_of(seq):.1f}", "x2": f"{x_of(seq):.1f}", "y1": "2",
                                           "y2": str(height - 2), "stroke": "#64748b", "stroke-dasharray": "3 3"})
        ET.SubElement(line, "title").text = f"compaction at seq {seq}"
    ET.SubElement(svg, "text", {"x": "4", "y": "14", "font-size": "11", "fill": "#475569"}).text = "seq 0"
    ET.SubElement(svg, "text", {"x": str(width - 4), "y": "14", "font-size": "11", "fill": "#475569",
                                "text-anchor": "end"}).text = f"seq {graph['max_seq']}"
    for fk in graph["forks"] + graph["merges"]:
        path = ET.SubElement(svg, "path", {
            "d": f"M{x_of(fk['from_seq']):.1f},{y_of(fk['from_lane']):.1f} "
                 f"L{x_of(fk['to_seq']):.1f},{y_of(fk['to_lane']):.1f}",
            "stroke": lane_colour(fk["to_lane"]), "stroke-width": "2", "fill": "none",
            "class": "fork" if fk in graph["forks"] else "merge"})
        ET.SubElement(path, "title").text = (f"fork of {bidi_visible(fk['branch'])} at seq {fk['from_seq']}"
                                             if "branch" in fk
                                             else f"merge at seq {fk['to_seq']}")
    for ln in lanes:
        y, colour = y_of(ln["lane"]), lane_colour(ln["lane"])
        name = bidi_visible(ln["branch"])  # a bidi control in a name is drawn written out, not applied
        label = name if len(name) <= 14 else name[:13] + "…"
        ET.SubElement(svg, "text", {"x": "4", "y": f"{y + 4:.1f}", "font-size": "12", "fill": colour}).text = label
        ET.SubElement(svg, "line", {"x1": f"{x_of(ln['from']):.1f}", "x2": f"{x_of(ln['to']):.1f}",
                                    "y1": f"{y:.1f}", "y2": f"{y:.1f}", "stroke": colour, "stroke-width": "4",
                                    "stroke-linecap": "round"})
        head = ET.SubElement(svg, "circle", {"cx": f"{x_of(ln['to']):.1f}", "cy": f"{y:.1f}", "r": "6",
                                             "fill": "#fff", "stroke": colour, "stroke-width": "3",
                                             "class": "head"})
        ET.SubElement(head, "title").text = f"{name}: head at seq {ln['to']}"
    return ET.tostring(svg, encoding="unicode")


def growth_chart(series: list[dict[str, Any]], *, width: int = 900, height: int = 240, top: int = 8) -> str:
    """Cumulative stored bytes over each task's chain (x: seq, y: bytes), one polyline per task
    (the ``top`` largest), from ``queries.storage_page()["growth"]``."""
    series = sorted((s for s in series if s["points"]), key=lambda s: s["points"][-1][1], reverse=True)[:top]
    left, bottom, pad = 70, 24, 8
    svg = _svg(width, height, "stored bytes over each task's chain")
    max_x = max((p[0] for s in series for p in s["points"]), default=1) or 1
    max_y = max((p[1] for s in series for p in s["points"]), default=1) or 1
    x_of = lambda x: left + (width - left - pad) * x / max_x  # noqa: E731
    y_of = lambda y: height - bottom - (height - bottom - pad) * y / max_y  # noqa: E731
    ET.SubElement(svg, "line", {"x1": str(left), "x2": str(left), "y1": str(pad), "y2": str(height - bottom),
                                "stroke": "#94a3b8"})
    ET.SubElement(svg, "line", {"x1": str(left), "x2": str(width - pad), "y1": str(height - bottom),
                                "y2": str(height - bottom), "stroke": "#94a3b8"})
    ET.SubElement(svg, "text", {"x": str(left - 4), "y": str(pad + 10), "font-size": "11",
                                "text-anchor": "end", "fill": "#475569"}).text = _human(max_y)
    ET.SubElement(svg, "text", {"x": str(width - pad), "y": str(height - 6), "font-size": "11",
                                "text-anchor": "end", "fill": "#475569"}).text = f"seq {max_x}"
    for i, s in enumerate(series):
        pts = " ".join(f"{x_of(x):.1f},{y_of(y):.1f}" for x, y in s["points"])
        line = ET.SubElement(svg, "polyline", {"points": pts, "fill": "none", "stroke": lane_colour(i),
                                               "stroke-width": "2"})
        ET.SubElement(line, "title").text = f"{bidi_visible(s['task_id'])}: {_human(s['points'][-1][1])}"
    return ET.tostring(svg, encoding="unicode")

