"""Records whose operator strings hold markup and quotes, and the check that a report page rendered from one has no
element and no attribute its template does not write (tests/unit/experiment/test_html_escaping.py,
tests/unit/tune/test_report_escaping.py).

``hostile(doc, text, ...)`` puts ``text`` in front of every non-empty string of a record (profile names, host names,
reasons, verdicts, findings, the space file's path, ...) and of every key of the maps that are operator strings too
(host names, knob names, profile names); its caller puts ``text`` itself in the fields a page prints as they are
(counts a stored record could hold as text). ``elements(page)`` parses a page with ``html.parser``: the page's own
elements (outside its plots) in order, with their attributes' names, and every tag and attribute name at all."""

from __future__ import annotations

from html.parser import HTMLParser
from typing import Any

from hypothesis import strategies as st

PAYLOADS = ("<script>alert(1)</script>", '"onload=x', "</textarea>")
Path = tuple[str, ...]


def hostile_texts() -> st.SearchStrategy[str]:
    """Each of ``PAYLOADS``, in any order, with a little text (a quote, an entity, nothing) around each."""
    glue = st.sampled_from(["", " ", "x", "'", "&amp;", "=", "`", '"'])
    return st.tuples(st.permutations(PAYLOADS), st.lists(glue, min_size=4, max_size=4)).map(
        lambda t: t[1][0] + t[0][0] + t[1][1] + t[0][1] + t[1][2] + t[0][2] + t[1][3]
    )


def hostile(
    doc: dict[str, Any], text: str, rename: tuple[Path, ...] = (), stringify: tuple[Path, ...] = ()
) -> dict[str, Any]:
    """``doc`` with ``text`` before every non-empty string but the record's ``kind``; the keys of each map whose
    path ends with one of ``rename`` renamed the same way (the same host, knob or profile keeps one name
    throughout), the values of one whose path ends with one of ``stringify`` made strings (knob values)."""

    def ends(path: Path, suffixes: tuple[Path, ...]) -> bool:
        return any(path[-len(s) :] == s for s in suffixes)

    def walk(node: Any, path: Path) -> Any:
        if isinstance(node, str):
            return node if path == ("kind",) or not node else text + node
        if isinstance(node, list):
            return [walk(v, path) for v in node]
        if not isinstance(node, dict):
            return node
        out = {}
        for k, v in node.items():
            key = text + k if ends(path, rename) and isinstance(k, str) and k else k
            out[key] = text + str(v) if ends(path, stringify) else walk(v, (*path, str(k)))
        return out

    out: dict[str, Any] = walk(doc, ())
    return out


class Elements(HTMLParser):
    """What ``html.parser`` reads in a page: its own elements in order (tag, attribute names), those inside its
    ``<svg>`` plots apart (matplotlib's, a number of them that depends on the data), every tag and end tag."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.own: list[tuple[str, tuple[str, ...]]] = []
        self.attributes: set[str] = set()
        self.tags: set[str] = set()
        self.end_tags: set[str] = set()
        self.text: list[str] = []
        self.depth = 0  # inside how many <svg>

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        names = tuple(name for name, _ in attrs)
        if self.depth == 0:
            self.own.append((tag, names))
        if tag == "svg":
            self.depth += 1
        self.tags.add(tag)
        self.attributes.update(names)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        self.handle_endtag(tag)

    def handle_endtag(self, tag: str) -> None:
        if tag == "svg":
            self.depth -= 1
        self.end_tags.add(tag)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def elements(page: str) -> Elements:
    parsed = Elements()
    parsed.feed(page)
    parsed.close()
    return parsed


def assert_escaped(page: str, benign: Elements) -> None:
    """``page`` (rendered from a hostile record) holds the same elements as ``benign`` (the same record with plain
    strings, parsed), no script, no textarea, no attribute ``benign`` has not (an ``on...`` handler: a quote that
    closed the attribute it was in), and shows every payload as text."""
    got = elements(page)
    assert "<script" not in page.lower() and "</textarea" not in page.lower()
    assert not {"script", "textarea"} & (got.tags | got.end_tags), got.tags | got.end_tags
    assert got.own == benign.own  # the template's elements, each with the attributes the template gives it
    assert got.tags <= benign.tags, got.tags - benign.tags
    assert got.attributes <= benign.attributes, got.attributes - benign.attributes
    assert not [a for a in got.attributes if a.startswith("on")]
    shown = "".join(got.text)
    assert all(p in shown for p in PAYLOADS), [p for p in PAYLOADS if p not in shown]
