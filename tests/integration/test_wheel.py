"""A non-editable install of the built wheel, outside the checkout, finds its roles, templates and catalogs."""

from __future__ import annotations

import site
import subprocess
import sys
import venv
from pathlib import Path

from tests.conftest import REPO


def test_wheel_installed_outside_the_repo_renders(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist), str(REPO)],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    (wheel,) = dist.glob("knobfleet-*.whl")
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    subprocess.run(
        [str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True, timeout=300
    )
    # Dependencies come from the test's own environment (no network needed); knobfleet itself from the wheel.
    deps = next(p for p in site.getsitepackages() if p.endswith("site-packages"))
    purelib = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    Path(purelib, "zz_deps.pth").write_text(deps + "\n")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    env = {"PATH": f"{env_dir / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path)}
    where = subprocess.run(
        [str(py), "-c", "import knobfleet, knobfleet.paths as p; print(knobfleet.__file__); print(p.project_root())"],
        cwd=outside,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    assert where[0].startswith(str(env_dir)) and where[1].endswith("knobfleet/_data")
    proc = subprocess.run(
        [
            str(env_dir / "bin" / "knobfleet"),
            "--examples",
            "render",
            "ctas512",
            "-i",
            str(REPO / "inventories" / "lab"),
            "--host",
            "lab1",
        ],
        cwd=outside,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "export SGLANG_SM120_MMA_TARGET_CTAS=512\n" in proc.stdout
    coll = Path(where[1], "ansible", "collections", "ansible_collections", "knobfleet", "serving")
    assert (coll / "plugins" / "modules" / "knob_generation.py").is_file()
    assert Path(where[1], "ansible", "apply.yml").is_file()
    assert Path(where[1], "profiles", "catalogs", "sglang.overlay.yaml").is_file()
    assert Path(where[1], "profiles", "catalogs", "generated", "sglang.yaml").is_file()
    assert Path(where[1]).parent.joinpath("module_utils", "knob_live.py").is_file()  # the fast path's copy

    # Outside a project, a command that reaches hosts refuses (as `profiles list` does) instead of using the
    # wheel's built-in lab inventory and ssh-ing to 127.0.1.1-3; --examples or -i say which hosts are meant.
    for argv in (["drift"], ["verify"], ["history"], ["profiles", "list"]):
        refused = subprocess.run(
            [str(env_dir / "bin" / "knobfleet"), *argv],
            cwd=outside,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert refused.returncode == 64, (argv, refused.stderr)
        assert "no knobfleet project here or above" in refused.stderr, refused.stderr
        assert refused.stderr.count("\n") == 1 and refused.stdout == ""
