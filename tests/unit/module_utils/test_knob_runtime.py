"""The on-host half of the container runtimes (module_utils/knob_runtime.py): the run line read back from a script or a
hand-written unit, the runtimes' own `container inspect` documents (recorded from podman 4.3.1 and docker 20.10.24 on
a lab host: tests/data/runtimes), the container's process tree, and the findings about the running container."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from knobfleet.module_utils.knob_running import check_container
from knobfleet.module_utils.knob_runtime import descendants, exec_start, split_run_line, view

DATA = Path(__file__).resolve().parents[2] / "data" / "runtimes"
IMAGE = "sha256:" + "c6779c5e75914350bdc5d27e25f5ef89f23a9981ef0ead3873edcb901981a98d"
OTHER = "sha256:" + "55b28386bacaf980caf7f32094e9108a07fbf8558bc8bf217f08e07e99a63dd8"


def test_podmans_recorded_inspect_names_the_running_engine_and_its_image() -> None:
    doc = json.loads((DATA / "podman-4.3.1-container-inspect.json").read_text())
    assert isinstance(doc, list), "podman 4.3 prints its whole array whatever --format says"
    seen = view(doc[0])
    assert seen == {"found": True, "pid": 669, "running": True, "image_id": IMAGE, "image": "localhost/knob-probe:1",
                    "restart": None, "started": "2026-12-06T12:32:32.242094308Z"}  # fmt: skip


def test_dockers_recorded_inspect_of_a_created_container_has_no_pid() -> None:
    seen = view(json.loads((DATA / "docker-20.10.24-container-inspect-created.json").read_text()))
    assert seen["found"] and seen["pid"] == 0 and not seen["running"]
    assert seen["image_id"] == OTHER and seen["image"] == "knob-probe:1" and seen["restart"] == "no"


@pytest.mark.parametrize("doc", [None, [], "x", {"State": "x", "Config": 3, "HostConfig": {"RestartPolicy": []}}])
def test_a_document_of_another_shape_is_read_without_raising(doc: Any) -> None:
    seen = view(doc)
    assert seen.get("pid", 0) == 0


UNIT = """[Service]
Type=notify
NotifyAccess=all
ExecStartPre=/bin/rm -f %t/%n.ctr-id
ExecStart=/usr/bin/podman run \\
        --cidfile=%t/%n.ctr-id \\
        --cgroups=no-conmon \\
        --rm \\
        --sdnotify=conmon \\
        -d \\
        --replace \\
        --name vllm \\
        -e VLLM_ATTENTION_BACKEND=FLASHINFER \\
        -v /models:/models:ro \\
        --restart always \\
        vllm/vllm-openai:v0.9.0 --model /models/x --port 8000
ExecStop=/usr/bin/podman stop --ignore -t 10 --cidfile=%t/%n.ctr-id
"""


def test_a_hand_written_podman_generate_systemd_unit_is_read_as_its_run_line() -> None:
    """The shape `podman generate systemd --new` writes (Debian's podman 4.3: no Quadlet), adopted as generation 0."""
    run = split_run_line(exec_start(UNIT))
    assert run is not None
    assert run["runtime"] == "podman" and run["name"] == "vllm" and run["image"] == "vllm/vllm-openai:v0.9.0"
    assert run["engine"] == ["--model", "/models/x", "--port", "8000"]
    assert run["env_pairs"] == {"VLLM_ATTENTION_BACKEND": "FLASHINFER"} and run["restart"] == "always"


@pytest.mark.parametrize(
    "argv",
    [[], ["/usr/bin/python3", "-m", "x"], ["/usr/bin/docker", "ps"], ["/usr/bin/docker", "run", "--rm"],
     ["/usr/bin/podman", "run", "--name", "x"]],
)  # fmt: skip
def test_a_line_that_runs_no_image_is_not_a_run_line(argv: list[str]) -> None:
    assert split_run_line(argv) is None


word = st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\0"), min_size=1, max_size=12)
opt = st.builds(
    lambda n, v: f"--{n}={v}",
    st.from_regex(r"[a-z][a-z-]{0,10}", fullmatch=True).filter(lambda n: n not in ("env", "name")),
    word,
)


@given(
    st.sampled_from(["docker", "podman"]),
    st.lists(opt, max_size=6),
    st.lists(st.from_regex(r"[A-Z][A-Z0-9_]{0,10}", fullmatch=True), max_size=5),
    st.lists(word, max_size=6),
)
def test_a_rendered_run_line_reads_back_to_its_parts(
    runtime: str, options: list[str], env: list[str], engine: list[str]
) -> None:
    argv = [f"/usr/bin/{runtime}", "run", "--rm", "--name=svc", *[f"--env={n}" for n in env], *options, IMAGE,
            "/usr/bin/python3", *engine]  # fmt: skip
    run = split_run_line(argv)
    assert run is not None
    assert run["image"] == IMAGE and run["engine"] == ["/usr/bin/python3", *engine] and run["name"] == "svc"
    assert run["env_names"] == env and run["options"][-len(options) or len(run["options"]) :] == (options or [])


def _doc(active: str = "active", running: bool = True, image: str = IMAGE) -> dict[str, Any]:
    return {"unit": "svc.service", "unit_props": {"ActiveState": active},
            "runtime": {"kind": "podman", "name": "svc", "found": True, "running": running, "pid": 42 if running else 0,
                        "image_id": image, "image": "localhost/sim:2"}}  # fmt: skip


@pytest.mark.parametrize(
    ("doc", "run", "kinds"),
    [
        (_doc(), {"image": IMAGE}, []),
        (_doc(image=OTHER), {"image": IMAGE}, ["image_mismatch"]),  # run or restarted by hand from another image
        (_doc(active="inactive"), {"image": IMAGE}, ["container_outside_unit"]),  # `podman run --name svc` by hand
        (_doc(active="inactive", running=False), {"image": IMAGE}, []),  # stopped: the unit's finding, not this
        (_doc(), {"image": IMAGE, "restart": "always"}, ["restart_policy"]),
        (_doc(), {"image": "vllm/vllm-openai:v0.9.0"}, []),  # a hand-written line by tag: nothing to compare
        ({"unit_props": {}}, {"image": IMAGE}, []),  # the runtime could not be asked: the service's own findings
    ],
)
def test_the_findings_about_the_running_container(doc: dict[str, Any], run: dict[str, Any], kinds: list[str]) -> None:
    out: list[dict[str, Any]] = []
    check_container(doc, {"container": run}, out)
    assert [f["kind"] for f in out] == kinds
    assert all("\n" not in f["message"] for f in out)


def test_a_containers_process_tree_is_read_from_the_parent_fields(tmp_path: Path) -> None:
    for pid, ppid in ((42, 1), (43, 42), (44, 42), (45, 43), (50, 1)):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(f"{pid} (python3 (x) y) S {ppid} 0 0\n")
    (tmp_path / "self").mkdir()
    assert descendants(42, str(tmp_path)) == [42, 43, 44, 45]
    assert descendants(99, str(tmp_path)) == [99]


def test_the_clients_answers_are_read_as_the_runtime_gives_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """inspect and image_id through a stand-in client printing podman 4.3's recorded answer (its whole array, whatever
    --format says), and what a missing client, a missing container and a missing image give."""
    from knobfleet.module_utils import knob_runtime

    client = tmp_path / "podman"
    recorded = DATA / "podman-4.3.1-container-inspect.json"
    client.write_text(
        "#!/bin/sh\n"
        f'case "$1 $2 $5" in "container inspect sglang-dsv4-decode") cat {recorded};; '
        f'"image inspect {IMAGE}") echo {IMAGE[7:]};; *) echo "Error: no such object" >&2; exit 125;; esac\n'
    )
    client.chmod(0o755)
    monkeypatch.setitem(knob_runtime.BINARIES, "podman", str(client))
    assert knob_runtime.inspect("podman", "sglang-dsv4-decode")["pid"] == 669
    assert knob_runtime.inspect("podman", "other") == {"found": False}
    assert knob_runtime.image_id("podman", IMAGE) == (IMAGE, "")
    assert knob_runtime.image_id("podman", OTHER) == (None, f"no image {OTHER} on this host")
    monkeypatch.setitem(knob_runtime.BINARIES, "podman", str(tmp_path / "absent"))
    assert knob_runtime.inspect("podman", "x")["error"].startswith("podman is not installed")
    assert knob_runtime.image_id("podman", IMAGE)[0] is None
