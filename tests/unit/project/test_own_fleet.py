"""A fleet repository of one's own: init, discovery from below, the project's profiles, catalog overlays and
inventory; the CLI conventions around it (help, confirmation, --json, exit codes, env defaults); the user's
Ansible settings; the collection generated from the single source."""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path

import pytest

import knobfleet
from knobfleet import collection, paths, project
from knobfleet.cli import build_parser, run
from knobfleet.errors import EXIT_USAGE
from tests.conftest import REPO


def call(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = run(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(autouse=True)
def _restore_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI writes global options into os.environ: recorded here so each test leaves it as it was."""
    for var in (
        "KNOBFLEET_VERBOSE",
        "KNOBFLEET_EXAMPLES",
        "ANSIBLE_VAULT_IDENTITY_LIST",
        "ANSIBLE_VAULT_PASSWORD_FILE",
    ):
        # setenv first: it records the variable's value now, so whatever the CLI writes into os.environ during the
        # test is undone after it (delenv of an unset variable records nothing); then unset it, because an empty
        # ANSIBLE_VAULT_PASSWORD_FILE means "the working directory" to Ansible
        monkeypatch.setenv(var, "")
        monkeypatch.delenv(var)


@pytest.fixture
def fleet_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("KNOBFLEET_HOME", raising=False)
    monkeypatch.delenv("KNOBFLEET_INVENTORY", raising=False)
    monkeypatch.delenv("ANSIBLE_INVENTORY", raising=False)
    monkeypatch.delenv("KNOBFLEET_EXAMPLES", raising=False)
    monkeypatch.setenv("KNOBFLEET_STATE_DIR", str(tmp_path / "state"))
    root = tmp_path / "myfleet"
    project.init(root)
    (root / "deep" / "er").mkdir(parents=True)
    monkeypatch.chdir(root / "deep" / "er")
    from knobfleet.profiles import catalog

    catalog.catalog_for.cache_clear()
    catalog.default_engine.cache_clear()
    return root


def test_init_writes_a_project_and_never_overwrites(tmp_path: Path) -> None:
    written = project.init(tmp_path / "f", name="prod")
    names = sorted(str(p.relative_to(tmp_path / "f")) for p in written)
    assert "knobfleet.toml" in names and "ansible.cfg" in names and "profiles/mybase.yaml" in names
    assert 'name = "prod"' in (tmp_path / "f" / "knobfleet.toml").read_text()
    with pytest.raises(project.ProjectError, match="already exists; knobfleet init never overwrites"):
        project.init(tmp_path / "f")


def test_the_project_is_found_from_below_and_its_profiles_are_used(
    fleet_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert paths.project_root() == fleet_dir
    assert paths.profiles_dir() == fleet_dir / "profiles"
    assert paths.uses_collection()
    code, out, err = call(capsys, "profiles", "list", "--json")
    assert code == 0, err
    assert [p["name"] for p in json.loads(out)["profiles"]] == ["mybase"]
    code, out, err = call(capsys, "profiles", "validate", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["ok"] and doc["profiles"][0]["ref"] == "mybase@1"
    assert doc["profiles"][0]["locked"] is False
    # the built-in examples only when asked
    code, out, _ = call(capsys, "--examples", "profiles", "list", "--json")
    assert "ctas512" in [p["name"] for p in json.loads(out)["profiles"]]


def test_a_bad_profile_is_one_line_in_json_too(fleet_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (fleet_dir / "profiles" / "bad.yaml").write_text(
        "schema_version: 1\nname: bad\nversion: 1\nengine: sglang\nenv:\n  SGLANG_SM120_MMA_TARGET_CTS: 512\n"
    )
    code, out, _ = call(capsys, "profiles", "validate", "bad", "--json")
    doc = json.loads(out)
    assert code == 1 and not doc["ok"]
    assert doc["problems"] == [
        f"{paths.display(fleet_dir / 'profiles' / 'bad.yaml')}: env.SGLANG_SM120_MMA_TARGET_CTS: unknown knob; "
        "did you mean SGLANG_SM120_MMA_TARGET_CTAS?"
    ]


def test_a_project_catalog_overlay_adds_a_knob(fleet_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (fleet_dir / "catalogs" / "sglang.overlay.yaml").write_text(
        "engine: sglang\nknobs:\n  SGLANG_MY_PATCH_KNOB:\n    kind: env\n    type: int\n    min: 0\n"
        "    origin: our patch 0042\n"
    )
    (fleet_dir / "profiles" / "patched.yaml").write_text(
        "schema_version: 1\nname: patched\nversion: 1\nextends: mybase\nenv:\n  SGLANG_MY_PATCH_KNOB: 3\n"
    )
    code, out, err = call(capsys, "profiles", "validate", "patched")
    assert code == 0, err
    assert out.startswith("ok  patched@1")


def test_bad_knobfleet_toml_names_file_key_and_fix(fleet_dir: Path) -> None:
    (fleet_dir / "knobfleet.toml").write_text('[project]\ninventroy = "x"\n')
    with pytest.raises(
        project.ProjectError, match=r"knobfleet.toml: project.inventroy: unknown key; did you mean inventory\?"
    ):
        project.load(fleet_dir)
    (fleet_dir / "knobfleet.toml").write_text("[project]\ninventory = 3\n")
    with pytest.raises(project.ProjectError, match=r"project.inventory: must be a non-empty string"):
        project.load(fleet_dir)


def test_without_a_project_an_installed_knobfleet_says_how_to_make_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KNOBFLEET_HOME", raising=False)
    monkeypatch.delenv("KNOBFLEET_EXAMPLES", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(paths, "_PACKAGE_DIR", tmp_path / "site-packages" / "knobfleet")
    paths._discover.cache_clear()
    try:
        with pytest.raises(Exception, match=r"no knobfleet project here or above.*knobfleet init DIR.*--examples"):
            paths.profiles_dir()
    finally:
        paths._discover.cache_clear()


def test_default_inventory_order(fleet_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from knobfleet.fleet.inventory import default

    assert default() == fleet_dir / "inventories" / "hosts.yml"
    monkeypatch.setenv("ANSIBLE_INVENTORY", str(tmp_path / "a.yml"))
    assert default() == tmp_path / "a.yml"
    monkeypatch.setenv("KNOBFLEET_INVENTORY", str(tmp_path / "k.yml"))
    assert default() == tmp_path / "k.yml"
    monkeypatch.setenv("KNOBFLEET_INVENTORY", "a.yml,b.yml")
    with pytest.raises(Exception, match="2 inventory sources; knobfleet reads one: pass -i PATH"):
        default()


def test_after_lab_up_n_2_the_default_is_the_two_host_inventory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    from knobfleet.fleet.inventory import default

    for var in ("KNOBFLEET_INVENTORY", "ANSIBLE_INVENTORY", "KNOBFLEET_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(REPO)
    state = tmp_path / "state"
    monkeypatch.setenv("KNOBFLEET_STATE_DIR", str(state))
    (state / "lab" / "run").mkdir(parents=True)
    (state / "lab" / "inventory").mkdir()
    (state / "lab" / "inventory" / "hosts.yml").write_text("all: {}\n")
    assert default() == REPO / "inventories" / "lab"  # no lab up
    for name in ("lab1", "lab2"):
        (state / "lab" / "run" / f"{name}.pid").write_text(str(os.getpid()))
    assert default() == state / "lab" / "inventory"
    (state / "lab" / "run" / "lab3.pid").write_text(str(os.getpid()))
    assert default() == REPO / "inventories" / "lab"


def _options(parser: argparse.ArgumentParser, where: str = "knobfleet") -> list[tuple[str, argparse.Action]]:
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += _options(sub, f"{where} {name}")
        elif not isinstance(action, argparse._HelpAction | argparse._VersionAction):
            out.append((where, action))
    return out


def test_every_option_and_argument_has_help() -> None:
    missing = [f"{w}: {a.option_strings or a.dest}" for w, a in _options(build_parser()) if not a.help]
    assert missing == []


@pytest.mark.parametrize(
    "argv",
    [
        ["apply", "ctas512"],
        ["apply", "ctas512", "--json"],
        ["rollback", "--limit", "lab1"],
        ["ab", "default", "ctas512", "--limit", "lab1"],
    ],
)
def test_changing_hosts_without_a_terminal_needs_yes(
    argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    code, out, err = call(capsys, *argv, "-i", str(REPO / "inventories" / "lab"))
    assert code == EXIT_USAGE, err
    assert "without confirmation; pass --yes" in err and out == ""


def test_bare_knobfleet_and_bad_options_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        call(
            capsys,
        )[0]
        == EXIT_USAGE
    )
    with pytest.raises(SystemExit) as exc:
        run(["drift", "--no-such-option"])
    assert exc.value.code == EXIT_USAGE
    assert "64  usage error" in build_parser().format_help()
    assert "inconclusive A/B" in build_parser().format_help()


def test_env_defaults_for_common_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KNOBFLEET_LIMIT", "lab2")
    monkeypatch.setenv("KNOBFLEET_VIA", "ansible")
    args = build_parser().parse_args(["drift"])
    assert (args.limit, args.via) == ("lab2", "ansible")


def test_verbose_and_vault_ids_become_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import os

    from knobfleet.cli import _environment

    pw = tmp_path / "p"
    pw.write_text("secret\n")  # a vault password file must exist and be a regular file (checked while parsing)
    args = build_parser().parse_args(["-vv", "drift", "--vault-id", f"prod@{pw}", "--vault-id", "dev@prompt"])
    _environment(args)
    assert os.environ["KNOBFLEET_VERBOSE"] == "2"
    assert os.environ["ANSIBLE_VAULT_IDENTITY_LIST"] == f"prod@{pw},dev@prompt"


def test_tables_wrap_long_notes_to_the_terminal() -> None:
    from knobfleet import report_text

    text = report_text.table(["host", "note"], [["lab1", "word " * 30]], width=50)
    assert max(len(line) for line in text.splitlines()) <= 50
    assert len(text.splitlines()) > 3
    assert report_text.table(["host", "note"], [["lab1", "word " * 30]], width=0).count("\n") == 2


def test_student_t_interval_at_three_runs() -> None:
    from statistics import NormalDist

    from knobfleet.experiment import stats

    assert stats.t_quantile_975(2) == pytest.approx(4.303)
    assert stats.t_quantile_975(2) / NormalDist().inv_cdf(0.975) == pytest.approx(2.2, abs=0.01)
    assert stats.t_quantile_975(200) == pytest.approx(1.972, abs=1e-3)
    low, high = stats.mean_interval_95([10.0, 12.0, 14.0])
    assert (low, high) == pytest.approx((12 - 4.303 * 2 / 3**0.5, 12 + 4.303 * 2 / 3**0.5))


# --- the user's Ansible --------------------------------------------------------------------------------------


def test_user_settings_from_the_project_ansible_cfg_and_env(tmp_path: Path) -> None:
    from knobfleet.fleet import ansible_cfg

    (tmp_path / "ansible.cfg").write_text(
        "[defaults]\nforks = 40\nremote_user = deploy\n[ssh_connection]\n"
        "ssh_common_args = -o ProxyJump=bastion\npipelining = False\n"
    )
    got = ansible_cfg.user_settings(tmp_path, environ={"ANSIBLE_TIMEOUT": "30"})
    assert got["forks"] == "40" and got["pipelining"] == "False" and got["timeout"] == "30"
    conn = ansible_cfg.connection_defaults(got)
    assert conn == {"ansible_ssh_common_args": "-o ProxyJump=bastion", "ansible_user": "deploy"}


def test_runner_overrides_only_what_the_user_left_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from knobfleet.fleet import runner

    monkeypatch.delenv("ANSIBLE_CONFIG", raising=False)
    monkeypatch.setenv("KNOBFLEET_HOME", str(tmp_path))
    monkeypatch.setenv("KNOBFLEET_STATE_DIR", str(tmp_path / "state"))
    (tmp_path / "ansible.cfg").write_text(
        "[defaults]\nforks = 40\ncallbacks_enabled = profile_tasks\n[ssh_connection]\nssh_args = -o ControlMaster=no\n"
    )
    env = runner._env(3)
    assert env["ANSIBLE_CONFIG"] == str(tmp_path / "ansible.cfg")
    assert "ANSIBLE_FORKS" not in env and "ANSIBLE_SSH_ARGS" not in env
    assert "ANSIBLE_CALLBACKS_ENABLED" not in env
    assert env["ANSIBLE_PIPELINING"] == "True" and env["ANSIBLE_SSH_CONTROL_PATH"] == "%(directory)s/%%C"
    monkeypatch.setenv("ANSIBLE_CONFIG", "/elsewhere/ansible.cfg")
    assert "ANSIBLE_CONFIG" not in runner._env(3)


def test_fast_path_uses_ansible_cfg_ssh_settings_and_host_vars_win() -> None:
    from knobfleet.fleet.hostvars import from_inventory_vars
    from knobfleet.fleet.transports import ssh
    from knobfleet.fleet.transports.sshcalls import ssh_argv

    hv = from_inventory_vars("web1", {"ansible_host": "127.0.9.5"}, "inv")
    defaults = {"ansible_ssh_common_args": "-o ProxyJump=root@jump", "ansible_user": "deploy"}
    argv = ssh_argv(hv, Path("/tmp/cp"), defaults)
    assert "ProxyJump=root@jump" in argv and "User=deploy" in argv
    hv2 = from_inventory_vars("web2", {"ansible_host": "127.0.9.6", "ansible_user": "ops"}, "inv")
    assert "User=ops" in ssh_argv(hv2, Path("/tmp/cp"), defaults)
    assert ssh.ineligible(hv, {"ansible_become": "true"}) == "web1: ansible_become"


# --- the collection -------------------------------------------------------------------------------------------


def test_collection_is_generated_from_the_single_source(tmp_path: Path) -> None:
    tree = collection.stage_collection(REPO, tmp_path / "ansible_collections" / "knobfleet" / "serving")
    gen = (tree / "plugins" / "modules" / "knob_generation.py").read_text()
    assert "from ansible_collections.knobfleet.serving.plugins.module_utils.knob_txn import" in gen
    assert "ansible.module_utils.knob_" not in gen.replace("ansible.module_utils.basic", "")
    for util in (REPO / "python" / "knobfleet" / "module_utils").glob("knob_*.py"):
        copy = (tree / "plugins" / "module_utils" / util.name).read_text()
        assert collection.rewrite_python(util.read_text()) == copy
    tasks = (tree / "roles" / "knob_serve" / "tasks" / "main.yml").read_text()
    assert "  knobfleet.serving.knob_generation:\n" in tasks and "\n  knob_generation:" not in tasks
    assert "role: knobfleet.serving.knob_serve\n" in (tree / "playbooks" / "apply.yml").read_text()
    assert not (tree / "roles" / "knob_serve" / "library").exists()
    assert f'version: "{knobfleet.__version__}"' in (tree / "galaxy.yml").read_text()


def test_fast_path_bundle_is_the_same_from_either_copy(tmp_path: Path) -> None:
    from knobfleet.fleet.transports.base import bundle

    tree = collection.stage_collection(REPO, tmp_path / "ansible_collections" / "knobfleet" / "serving")
    ours = bundle((REPO / "roles" / "knob_probe" / "library" / "knob_probe.py").read_bytes(), paths.module_utils_dir())
    theirs = bundle((tree / "plugins" / "modules" / "knob_probe.py").read_bytes(), tree / "plugins" / "module_utils")
    assert json.loads(ours)["module"] == json.loads(theirs)["module"]
    assert [n for n, _ in json.loads(ours)["utils"]] == [n for n, _ in json.loads(theirs)["utils"]]
