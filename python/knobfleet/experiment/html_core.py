"""The parts every report page is made of (experiment/html.py, html_ab.py, tune/report.py): the one jinja2
environment the pages are rendered in (templates/*.html.j2: the page shell with its Content-Security-Policy, tables,
the provenance section; every value escaped by the environment, none by hand), inline SVG plots drawn by
matplotlib, and the rows of the provenance section (the profiles with their content hashes, the engine version).
Pure: data in, text out."""

from __future__ import annotations

import functools
import io
import json
import math
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from markupsafe import Markup

if TYPE_CHECKING:  # jinja2 costs ~50 ms to import: only a page written pays it
    import jinja2

# The page may load nothing: a reference that slipped in would be blocked (and show as a console error).
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"

MAX_SETTINGS_ROWS = 400  # an engine's resolved settings: every scalar leaf, up to this many rows


@functools.cache
def environment() -> jinja2.Environment:
    """The one environment every page is rendered in: the templates under experiment/templates/, every value
    escaped as it is written (``autoescape``), and a name the template uses but was not given is an error."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("knobfleet.experiment", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.globals.update(csp=Markup(CSP), max_settings_rows=MAX_SETTINGS_ROWS)  # constants of this module
    return env


def render_page(template: str, title: str, decision: str, verdict: str, **parts: Any) -> str:
    """``template`` (a page under experiment/templates/) with the page's title, its decision sentence, the verdict
    that colours it and the template's own ``parts``: plain values, escaped where the template writes them. Only
    ``svg``'s plots (Markup) are written as they are."""
    return environment().get_template(template).render(title=title, decision=decision, verdict=verdict, **parts)


def pct(x: float | None) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x * 100:+.1f}%"


def svg(draw: Callable[[Any], None], size: tuple[float, float] = (8.0, 4.0), integer_x: bool = True) -> Markup | None:
    """``draw(ax)`` on a fresh figure, as inline SVG: matplotlib's metadata, XML header, DOCTYPE and namespace
    declarations removed, ids made deterministic. Without matplotlib: None (the page says so and keeps its tables).

    Markup, written into the page as it is: matplotlib's SVG writer draws the text as paths and escapes every
    string it writes itself (the text's comment, an id), and the rest is numbers (tests/unit/experiment/
    test_html_escaping.py renders labels of markup and quotes)."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # text.parse_math off: a label from a record (a phase, a host, a profile) is text, never mathtext (a phase named
    # "$$" raised matplotlib's ParseException and took the whole page down)
    with matplotlib.rc_context({"svg.hashsalt": "knobfleet", "svg.fonttype": "path", "text.parse_math": False}):
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
    return Markup(text)


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


def settings_rows(settings: Any) -> tuple[list[tuple[str, str]], bool]:
    """The settings the engine resolved (its own report, secrets already redacted): every leaf as a row, up to
    ``MAX_SETTINGS_ROWS``, and whether the tree had more (the template's ``settings_table``)."""
    rows = flatten(settings)
    return rows[:MAX_SETTINGS_ROWS], len(rows) > MAX_SETTINGS_ROWS


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


def provenance(doc: dict[str, Any], extra: list[list[Any]] | None = None) -> list[list[Any]]:
    """The rows of the section that says what ran (the template's ``provenance``): each profile with its content
    hash and where the hash comes from, the engine version, and ``extra`` rows (what, value, source)."""
    rows: list[list[Any]] = []
    for role, ref in profile_roles(doc):
        digest, source = profile_hash(doc, ref)
        rows.append([f"{role}: {ref}", digest, source])
    return rows + engine_rows(doc) + (extra or [])
