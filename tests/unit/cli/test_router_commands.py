"""``router status`` and ``router readd`` print what routers say (their error text, the workers they list) and the
inventory's host names: every such string reaches the terminal escaped (``report_text.visible``), on one line, whatever
the router answers. Issue 56, cause 11: ``router readd`` printed a router's message raw."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from knobfleet.errors import EXIT_ERROR, EXIT_UNREACHABLE
from tests.unit.cli.test_commands import call

HOSTILE = "router says \x1b[2J\x1b]0;pwned\x07 ok\u3164\u2800\u202e\r\nforged: ok\ufe0f"
ESCAPED = "router says \\x1b[2J\\x1b]0;pwned\\x07 ok\\u3164\\u2800\\u202e\\r\\nforged: ok\\ufe0f"


def raw_leak(text: str) -> list[str]:
    """Every character of ``text`` a terminal would not show as itself (the newlines ending lines aside)."""
    return [c for c in text if c in "\x1b\x07\r\u3164\u2800\u202e\ufe0f"]


@pytest.fixture
def routed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """One routed host whose router answers every listing of its workers with an error of text ``router["text"]``
    (readd and status then print it as the host's line)."""
    from knobfleet.fleet import router_kinds
    from knobfleet.fleet.router import Outcome, RouterError
    from knobfleet.ops import fleet

    monkeypatch.setenv("KNOBFLEET_STATE_DIR", str(tmp_path / "state"))  # never this machine's own state folder
    router: dict[str, Any] = {"text": HOSTILE, "host": "gpu-1"}
    hv = SimpleNamespace(host="gpu-1", router_url="http://127.0.9.9:30080", router_kind="sglang",
                         base_url="http://127.0.9.1:30000")  # fmt: skip

    class Router:
        def list_workers(self) -> list[Any]:
            raise RouterError(Outcome.UNREACHABLE, router["text"])

    monkeypatch.setattr(router_kinds, "router_for", lambda kind, url: Router())
    monkeypatch.setattr(
        fleet, "hosts", lambda inventory, limit: [SimpleNamespace(**{**vars(hv), "host": router["host"]})]
    )
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  hosts:\n    gpu-1:\n")
    router["inventory"] = str(inv)
    return router


@pytest.mark.parametrize(
    ("host", "text", "line"),
    [
        ("gpu-1", HOSTILE, f"error: gpu-1: {ESCAPED}"),
        ("gpu\u3164-1\x1b[8m", "refused", "error: gpu\\u3164-1\\x1b[8m: refused"),
        ("gpu-1", "\u115f\u1160\uffa0\u180e\u200b\u2060\u2064\ufeff\U0001d159",
         "error: gpu-1: \\u115f\\u1160\\uffa0\\u180e\\u200b\\u2060\\u2064\\ufeff\\U0001d159"),
    ],
)  # fmt: skip
def test_readd_shows_a_routers_message_and_a_host_name_escaped_on_one_line(
    capsys: pytest.CaptureFixture[str], routed: dict[str, Any], host: str, text: str, line: str
) -> None:
    routed.update(host=host, text=text)
    code, out, err = call(capsys, "router", "readd", "-i", routed["inventory"], "--yes")
    assert code == EXIT_ERROR and err == ""
    assert out == line + "\n" and not raw_leak(out), ascii(out)


def test_readd_escapes_the_message_of_a_worker_put_back(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from knobfleet.ops import fleet, routing

    monkeypatch.setenv("KNOBFLEET_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(fleet, "hosts", lambda inventory, limit: [])
    monkeypatch.setattr(routing, "readd", lambda hosts: [("gpu-1", True, "put back \x1b[2J\u3164")])
    (tmp_path / "hosts.yml").write_text("all:\n  hosts:\n    gpu-1:\n")
    code, out, _ = call(capsys, "router", "readd", "-i", str(tmp_path / "hosts.yml"), "--yes")
    assert code == 0 and out == "gpu-1: put back \\x1b[2J\\u3164\n"


def test_status_shows_every_cell_escaped_and_aligned(
    capsys: pytest.CaptureFixture[str], routed: dict[str, Any]
) -> None:
    routed.update(host="gpu\u3164-1")
    code, out, err = call(capsys, "router", "status", "-i", routed["inventory"])
    assert code == EXIT_UNREACHABLE and err == ""
    assert not raw_leak(out), ascii(out)
    _header, rule, row = out.splitlines()  # the message's CR LF is escaped: still one row
    assert row.startswith("gpu\\u3164-1  http://127.0.9.1:30000  http://127.0.9.9:30080  " + ESCAPED[:20])
    assert len(rule.split()[0]) == len("gpu\\u3164-1")  # the column is as wide as what shows
