"""One rule set, two readers: the controller's validators are the compiled patterns of rules.json, and for any
text the controller's verdict is the role's (ansible's `regex` test with match_type='fullmatch'). Human output
shows raw terminal escapes, CR and invisible characters escaped. init makes all or nothing; file errors are one
line at the error boundary."""

from __future__ import annotations

import argparse
import errno
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from knobfleet import project, rules
from knobfleet.cli import run
from knobfleet.errors import KnobfleetError
from knobfleet.fleet import hostvars
from knobfleet.profiles import model
from knobfleet.report_text import table, visible


def test_the_controllers_validators_are_the_rule_files_patterns() -> None:
    assert model.ENV_NAME_RE is rules.regex("env_name")
    assert model.FLAG_NAME_RE is rules.regex("flag_name")
    assert model.PROFILE_NAME_RE is rules.regex("profile_name")
    assert model.ENGINE_NAME_RE is rules.regex("engine_name")
    assert hostvars.SAFE_PATH_RE is rules.regex("path")
    assert hostvars.SERVICE_RE is rules.regex("service")
    assert hostvars.USER_RE is rules.regex("user")
    assert hostvars.LISTEN_RE is rules.regex("listen_host")


NEAR_MISSES = st.one_of(
    st.text(max_size=12),
    st.text(alphabet="az_09-/.@:\n\t \u200b\x00Z", max_size=12),
    st.sampled_from(["root", "root\n", "/root/serve.sh", "/root/../x", "/a/.", "127.0.0.1\n", "X=1;touch", "65535"]),
)


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(sorted(rules.data()["patterns"])), text=NEAR_MISSES)
def test_controller_and_role_give_the_same_verdict(name: str, text: str) -> None:
    from ansible.plugins.test.core import regex as ansible_regex

    role = ansible_regex(text, rules.pattern(name), match_type="fullmatch")
    assert (rules.check(name, text) is None) is role


@pytest.mark.parametrize(
    ("name", "text"),
    [("user", "root\n"), ("service", "eng\n"), ("path", "/root/serve.sh\n"), ("path", "/a/../b"), ("port", "0")],
)
def test_a_trailing_newline_or_dot_segment_never_passes(name: str, text: str) -> None:
    assert rules.check(name, text) is not None


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("a\x1b[2Jb", "a\\x1b[2Jb"),
        ("ok\rEVIL", "ok\\rEVIL"),
        ("x\u200by", "x\\u200by"),
        ("x\u202ey", "x\\u202ey"),
        ("line1\nline2\tend", "line1\nline2\tend"),
        ("caf\udce9", "caf\\udce9"),
        ("plain text ünï", "plain text ünï"),
    ],
)
def test_visible_escapes_what_would_hide_or_rewrite(text: str, shown: str) -> None:
    assert visible(text) == shown


@given(st.text())
def test_visible_output_has_nothing_invisible_but_newlines_and_tabs(text: str) -> None:
    out = visible(text)  # the blank letters isprintable passes (U+3164 …): tests/unit/test_report_text.py
    assert all(not rules.invisible(c) or c in "\n\t" for c in out)
    if all(not rules.invisible(c) or c in "\n\t" for c in text):
        assert out == text


def test_tables_show_values_escaped() -> None:
    assert "\x1b" not in table(["k", "v"], [["a", "x\x1b[31mred"]]) and "\\x1b[31mred" in table(
        ["k", "v"], [["a", "x\x1b[31mred"]]
    )


def test_init_with_a_non_utf8_folder_name_leaves_nothing_and_a_rerun_works(tmp_path: Path) -> None:
    bad = Path(tmp_path.as_posix() + "/proj\udcff")  # the folder name holds the byte 0xff
    with pytest.raises(project.ProjectError) as info:
        project.init(bad)
    assert str(info.value) == (
        "'proj\\udcff': DIR's folder name has the byte 0xff that is not UTF-8; pass --name NAME (nothing was written)"
    )
    assert not bad.exists()
    written = project.init(bad, name="proj")
    assert (bad / "knobfleet.toml").read_text().count('name = "proj"') == 1 and len(written) == 7
    assert project.load(bad).name == "proj"


def test_init_names_are_toml_escaped(tmp_path: Path) -> None:
    project.init(tmp_path / "p", name='my "fleet" \\ x')
    assert project.load(tmp_path / "p").name == 'my "fleet" \\ x'


def test_init_refuses_an_invisible_name(tmp_path: Path) -> None:
    with pytest.raises(project.ProjectError) as info:
        project.init(tmp_path / "p", name="fleet\u200b")
    assert (
        str(info.value)
        == "'fleet\\u200b': --name contains U+200B ZERO WIDTH SPACE (invisible); pass --name NAME (nothing was written)"
    )
    assert not (tmp_path / "p").exists()


def test_init_that_fails_part_way_removes_what_it_wrote(tmp_path: Path) -> None:
    target = tmp_path / "p"
    (target / "README.md").mkdir(parents=True)  # with --force, the write of README.md fails after others
    with pytest.raises(KnobfleetError, match=r"README\.md: is a directory"):
        project.init(target, name="p", force=True)
    assert sorted(p.name for p in target.iterdir()) == ["README.md"]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'[project]\nname = "caf\xe9"\n', "byte 21: not valid UTF-8; save the knobfleet.toml as UTF-8"),
        (b"[project]\nname = 1\n", "project.name: must be a non-empty string (the project's name)"),
    ],
)
def test_a_bad_knobfleet_toml_is_one_line(tmp_path: Path, body: bytes, expected: str) -> None:
    (tmp_path / "knobfleet.toml").write_bytes(body)
    with pytest.raises(project.ProjectError) as info:
        project.load(tmp_path)
    assert str(info.value) == f"{tmp_path}/knobfleet.toml: {expected}"


def test_an_os_error_at_the_boundary_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    def read_only(args: argparse.Namespace) -> int:
        raise OSError(errno.EROFS, "Read-only file system", "/srv/knobfleet/state/cache")

    parser = argparse.ArgumentParser()
    parser.set_defaults(func=read_only)
    assert run([], parser) == 1
    assert capsys.readouterr().err == (
        "knobfleet: /srv/knobfleet/state/cache: Read-only file system; nothing more was done\n"
    )


@pytest.mark.parametrize(
    "name",
    [
        "table",
        "profile_list",
        "profile_show",
        "waves_table",
        "apply_summary",
        "drift_report",
        "drift_head",
        "drift_rows",
        "drift_tail",
        "history_report",
        "rollback_report",
    ],
)
def test_every_human_rendering_passes_through_visible(name: str) -> None:
    from knobfleet import report, report_knobs, report_rollout, report_text

    home = next(m for m in (report, report_rollout, report_knobs, report_text) if name in vars(m))
    assert getattr(vars(home)[name], "__wrapped__", None) is not None, f"{home.__name__}.{name} is not @_human"


def test_a_plan_diff_shows_a_hiding_value_escaped() -> None:
    from types import SimpleNamespace

    from knobfleet.report_rollout import apply_summary

    diff = "--- a\n+++ b\n-export NCCL_DEBUG=WARN\n+export NCCL_DEBUG='INFO\r\x1b[2KWARN'\n"
    host = SimpleNamespace(
        host="h1",
        seen={},
        generation=None,
        previous=None,
        main_pid=None,
        ready_s=None,
        message="",
        restarted=False,
        status="pending",
        knob_changes=["NCCL_DEBUG: WARN -> INFO\r\x1b[2KWARN"],
        diffs=[{"diff": diff}],
        restored=None,
        committed=False,
        lock=None,
    )
    result = SimpleNamespace(
        hosts=[host], check=True, wall_s=0.1, profile=SimpleNamespace(ref="p@1", content_hash="sha256:" + "0" * 64)
    )
    text = apply_summary(result)
    assert "\x1b" not in text and "\r" not in text
    assert "+export NCCL_DEBUG='INFO\\r\\x1b[2KWARN'" in text and "NCCL_DEBUG: WARN -> INFO\\r\\x1b[2KWARN" in text
