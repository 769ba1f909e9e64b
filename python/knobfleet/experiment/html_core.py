"""The parts every report page is made of (experiment/html.py, html_ab.py, tune/report.py): the page shell with its
Content-Security-Policy, tables, inline SVG plots drawn by matplotlib, and the provenance section (the profiles
with their content hashes, the engine version). Pure: data in, text out."""

from __future__ import annotations

import html
import io
import json
import math
import re
from collections.abc import Callable, Sequence
from typing import Any

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:2em auto;max-width:1000px;color:#222}
h1{font-size:1.5em}h2{font-size:1.15em;margin-top:2em;border-bottom:1px solid #ddd}
.decision{font-size:1.15em;padding:.6em .9em;border-left:5px solid #888;background:#f6f6f6}
.promote{border-color:#2a7}.rollback,.keep{border-color:#c33}.inconclusive{border-color:#d90}
table{border-collapse:collapse;font-size:12.5px}td,th{border:1px solid #ddd;padding:2px 6px;text-align:right}
th{background:#f3f3f3}td.l,th.l{text-align:left}code{font-size:12px}.plot svg{max-width:100%;height:auto}
.note{color:#666}summary{cursor:pointer}
"""


# The page may load nothing: a reference that slipped in would be blocked (and show as a console error).
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"

MAX_SETTINGS_ROWS = 400  # an engine's resolved settings: every scalar leaf, up to this many rows


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def pct(x: float | None) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x * 100:+.1f}%"


def page(title: str, decision: str, verdict: str, sections: list[str]) -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body>\n"
        f'<h1>{esc(title)}</h1>\n<p class="decision {esc(verdict)}">{esc(decision)}</p>\n'
        + "\n".join(sections)
        + '\n<p class="note">Written by knobfleet. Self-contained: nothing in this file is loaded from a URL.</p>'
        "\n</body></html>\n"
    )


def table(headers: list[str], rows: list[list[Any]], left: int = 1) -> str:
    head = "".join(f"<th{' class=l' if i < left else ''}>{esc(h)}</th>" for i, h in enumerate(headers))
    body = "".join(
        "<tr>" + "".join(f"<td{' class=l' if i < left else ''}>{esc(c)}</td>" for i, c in enumerate(r)) + "</tr>"
        for r in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def svg(draw: Callable[[Any], None], size: tuple[float, float] = (8.0, 4.0), integer_x: bool = True) -> str:
    """``draw(ax)`` on a fresh figure, as inline SVG: matplotlib's metadata, XML header, DOCTYPE and namespace
    declarations removed, ids made deterministic. Without matplotlib: a note (the page keeps its tables)."""
    try:
        import matplotlib
    except ImportError:
        return '<p class="note">(plots need matplotlib: pip install "knobfleet[plots]")</p>'
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with matplotlib.rc_context({"svg.hashsalt": "knobfleet", "svg.fonttype": "path"}):
        fig, ax = plt.subplots(figsize=size, dpi=96)
        try:
            draw(ax)
            if integer_x:
                from matplotlib.ticker import MaxNLocator

                ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # windows, rounds, concurrency: whole numbers
            ax.grid(alpha=0.3)
            fig.tight_layout()
            buf = io.StringIO()
            fig.savefig(buf, format="svg", metadata={"Creator": None, "Date": None, "Format": None, "Type": None})
        finally:
            plt.close(fig)
    text = buf.getvalue()
    text = re.sub(r"<\?xml[^>]*\?>\s*", "", text)
    text = re.sub(r"<!DOCTYPE[^>]*>\s*", "", text)
    text = re.sub(r"<metadata>.*?</metadata>\s*", "", text, flags=re.S)
    # Inline in HTML the parser puts <svg> and xlink:href in their namespaces itself: the page names no URL at all.
    text = re.sub(r'\s+xmlns(?::xlink)?="http://www\.w3\.org/[^"]*"', "", text, count=2)
    return f'<div class="plot">{text}</div>'


def mean_interval(values: Sequence[float]) -> tuple[float, float]:
    """(mean, half-width of its 95% Student-t interval); the half-width is 0 for a single value."""
    from knobfleet.experiment.stats import t_quantile_975

    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, 0.0
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, t_quantile_975(n - 1) * sd / math.sqrt(n)


def flatten(node: Any, prefix: str = "", depth: int = 0) -> list[tuple[str, str]]:
    """Every scalar leaf of a JSON tree as (dotted path, value), in the tree's order; below 12 levels a subtree is
    one row of JSON (cut at 200 characters)."""
    if depth >= 12 and isinstance(node, dict | list):
        return [(prefix, json.dumps(node)[:200])]
    if isinstance(node, dict):
        items: list[tuple[str, Any]] = [(f"{prefix}.{k}" if prefix else str(k), v) for k, v in node.items()]
    elif isinstance(node, list):
        items = [(f"{prefix}[{i}]", v) for i, v in enumerate(node)]
    else:
        return [(prefix, "null" if node is None else json.dumps(node) if isinstance(node, bool) else str(node))]
    out: list[tuple[str, str]] = []
    for path, value in items:
        out += flatten(value, path, depth + 1)
        if len(out) > MAX_SETTINGS_ROWS:
            break
    return out


def settings_table(settings: Any) -> str:
    """The settings the engine resolved (its own report, secrets already redacted), every leaf as a row, folded."""
    rows = flatten(settings)
    if not rows:
        return "<p>none reported</p>"
    cut = len(rows) > MAX_SETTINGS_ROWS
    shown = [list(r) for r in rows[:MAX_SETTINGS_ROWS]]
    more = f'<p class="note">(the first {MAX_SETTINGS_ROWS}; the whole tree is in the record)</p>' if cut else ""
    return (f"<details><summary>{len(shown)}{'+' if cut else ''} setting(s) as the engine reported them</summary>"
            f"{table(['setting', 'value'], shown, 2)}{more}</details>")  # fmt: skip


# --- provenance: the profiles that ran, their content hashes, the engine -------------------------------------


def profile_roles(doc: dict[str, Any]) -> list[tuple[str, str]]:
    """(role, profile ref or name) for each profile a record names: A and B, a canary's or a bench's profile, a
    campaign's base and decision."""
    if doc.get("kind") == "tune":
        d = doc.get("decision") or {}
        pairs = [("current (base)", doc.get("base")), ("decision", d.get("profile"))]
    elif {"a", "b"} <= set(doc):
        pairs = [("A", doc.get("a")), ("B", doc.get("b"))]
    else:
        pairs = [("profile", doc.get("profile"))]
    seen: set[str] = set()
    out = []
    for role, ref in pairs:
        if isinstance(ref, str) and ref and ref not in seen:
            seen.add(ref)
            out.append((role, ref))
    return out


def profile_hash(doc: dict[str, Any], ref: str) -> tuple[str, str]:
    """(content hash, where it comes from) of ``ref``: recorded by the run (``profile_hashes``), read from
    profiles/profiles.lock when the page was written (``locked_hashes``, present when the lock was read), or
    ("-", why there is none)."""
    recorded = doc.get("profile_hashes") or {}
    locked = doc.get("locked_hashes")
    if isinstance(recorded, dict) and isinstance(recorded.get(ref), str):
        return recorded[ref], "recorded by the run"
    if isinstance(locked, dict) and isinstance(locked.get(ref), str):
        return locked[ref], "profiles/profiles.lock (a published version's content never changes)"
    if "@" not in ref:
        return "-", "not recorded: the record names the profile without its version"
    if isinstance(locked, dict):
        return "-", "not recorded by the run, and not a published version in profiles/profiles.lock"
    return "-", "not recorded by the run"


def engine_rows(doc: dict[str, Any]) -> list[list[Any]]:
    """The engine version(s) the record holds: one (``engine_version``) or per host (``engine_versions``), then the
    generation each host ran (``generations``: read from the hosts when the command ended, ``experiment.running``)."""
    per_host = doc.get("engine_versions")
    if isinstance(per_host, dict) and per_host:
        rows = [[f"engine on {h}", v, "reported by the engine"] for h, v in sorted(per_host.items())]
    elif doc.get("engine_version"):
        rows = [["engine", doc["engine_version"], "reported by the engine"]]
    else:
        rows = [["engine", "-", "not recorded: the engine reported no version when the run ended"]]
    gens = doc.get("generations")
    if isinstance(gens, dict) and gens:
        rows += [[f"generation on {h}", f"{g:04d}" if isinstance(g, int) else str(g), "read from the host"]
                 for h, g in sorted(gens.items())]  # fmt: skip
    else:
        rows.append(["generation", "-", "not recorded by this record"])
    return rows


def provenance(doc: dict[str, Any], extra: list[list[Any]] | None = None) -> str:
    """The section that says what ran: each profile with its content hash and where the hash comes from, the
    engine version, and ``extra`` rows (what, value, source)."""
    rows: list[list[Any]] = []
    for role, ref in profile_roles(doc):
        digest, source = profile_hash(doc, ref)
        rows.append([f"{role}: {ref}", digest, source])
    rows += engine_rows(doc) + (extra or [])
    return "<h2>What ran: profiles and engine</h2>" + table(["", "content hash / version", "source"], rows, 3)
