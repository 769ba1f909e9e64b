"""Issue 56, item 1: one rule for secret values (``knobfleet.secretrule``), by provenance (every value a vault
decrypted in this process) and by shape, applied where free text leaves the process: every one-line error, the
internal-error line and its crash file. Everything is written in the test's temp dir."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from knobfleet import secretrule
from knobfleet.errors import KnobfleetError
from tests.unit.security.test_vault_files import SECRET, inventory

TOKEN = "ghp_" + "Z9y8X7w6V5u4T3s2R1q0P9o8N7m6L5k4J3"


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    secretrule.forget()
    yield
    secretrule.forget()


@settings(max_examples=200, deadline=None)
@given(
    value=st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=4, max_size=40),
    before=st.text(max_size=30),
    after=st.text(max_size=30),
    form=st.sampled_from(["raw", "repr", "json"]),
)
def test_a_remembered_vault_value_never_survives_in_any_form(value: str, before: str, after: str, form: str) -> None:
    secretrule.remember([value])
    shown = {"raw": value, "repr": repr(value)[1:-1], "json": json.dumps(value)[1:-1]}[form]
    out = secretrule.scrub(f"{before}{shown}{after}")
    assert shown not in out or shown in secretrule.VAULT_MARK
    assert secretrule.VAULT_MARK in out


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        (f'{{"url": "https://u:p4ss/w rd@db.local/x", "token": "{TOKEN}", "n": 1}}', True),
        (f"--hf-token {TOKEN}, then", False),
        ("a model at /models/DeepSeek-V4-sim and 127.0.1.1:30000", None),
        ("sk-" + "a" * 24 + "]}", True),
    ],
    ids=["json-stays-json", "flag-value", "nothing-secret", "closing-brackets-kept"],
)  # fmt: skip
def test_a_credential_shape_is_replaced_and_the_text_keeps_its_shape(text: str, kept: bool | None) -> None:
    out = secretrule.scrub(text)
    if kept is None:
        assert out == text
        return
    assert TOKEN not in out and "p4ss" not in out and "a" * 24 not in out and secretrule.SHAPE_MARK in out
    if text.startswith("{"):
        assert json.loads(out)["n"] == 1
    if text.endswith("]}"):
        assert out.endswith("]}")


def test_short_vault_values_are_not_replaced_in_text() -> None:
    secretrule.remember(["8080", "on", 7])  # type: ignore[list-item]
    assert secretrule.scrub("port 8080 on") == f"port {secretrule.VAULT_MARK} on"
    assert secretrule.scrub(f"gpu rtx-pro-6000, key {TOKEN}") == f"gpu rtx-pro-6000, key {secretrule.SHAPE_MARK}"


@pytest.mark.parametrize("raised", ["knobfleet-error", "os-error", "internal-error"])
def test_no_exit_of_the_cli_shows_a_value_the_inventory_read_decrypted(
    vault_project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], raised: str
) -> None:
    """A vault-file value read by the inventory, then quoted by an error three layers later: the one line on
    stderr, and for an internal error its crash file too, show a marker."""
    from knobfleet import cli
    from knobfleet.cli import history
    from knobfleet.fleet.inventory import load_hosts

    tmp_path = vault_project
    inv = inventory(tmp_path, f"knob_serve_host_env:\n  SGLANG_API_SECRET: {SECRET}\n")

    def failing(args: object) -> int:
        load_hosts(inv)  # the read that decrypts the vault file
        if raised == "knobfleet-error":
            raise KnobfleetError(f"host lab1: SGLANG_API_SECRET={SECRET} is not what the engine runs; {TOKEN}")
        if raised == "os-error":
            raise OSError(13, f"denied for {SECRET}", str(tmp_path / SECRET))
        raise RuntimeError(f"unexpected {SECRET!r} and {TOKEN}")

    monkeypatch.setattr(history, "cmd_history", failing)
    code = cli.run(["history"], cli.build_parser("history"))
    err = capsys.readouterr().err
    assert code != 0 and len(err.strip().splitlines()) == 1, err
    assert SECRET not in err and TOKEN not in err and "<a vault value>" in err
    written = "".join(p.read_text(errors="replace") for p in (tmp_path / "state").rglob("*") if p.is_file())
    assert SECRET not in written and TOKEN not in written
    if raised == "internal-error":
        assert "<a vault value>" in (tmp_path / "state" / "crash.txt").read_text()


@pytest.mark.parametrize(
    ("line", "want"),
    [
        ("https://u:p4ss/w rd@db.local/x more", "<a secret> more"),
        ("x=postgres://admin:s3cr@t@db:5432/app, then", "x=<a secret>, then"),
        ("prom:http://u:p@h/q", "prom:<a secret>"),
        ("http://host:8080/path", "http://host:8080/path"),
        ("a://b:" * 3 + "@", "<a secret>"),  # the shape of the 100 KB line that took seconds, short
        ("one\nhttp://u:p@h\r\nthree", "one\n<a secret>\r\nthree"),
    ],
    ids=["space-slash", "at-in-password", "after-a-colon", "no-password", "repeated-schemes", "lines"],
)  # fmt: skip
def test_a_url_password_is_found_line_by_line_as_the_shape_reads_it(line: str, want: str) -> None:
    """The URL shape, read in time linear in the line (a scheme tried from every position, each run to the line's
    last "@", was quadratic: the attack harness's 100 KB names hit its 10 s bound)."""
    assert secretrule.scrub(line) == want
