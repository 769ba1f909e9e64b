"""The lab router's pure parts: its command line and environment (loopback only, offline), the download check of
its log, and the group vars it writes."""

from __future__ import annotations

import pytest

from knobfleet.errors import LabError
from knobfleet.fleet.hostvars import from_inventory_vars
from knobfleet.lab import router_install
from knobfleet.lab.router_lab import download_attempts, is_loopback, router_argv, router_env, router_group_vars

# Lines of a real sglang-router 0.3.2 log that loaded a local tokenizer (ANSI colours as the router writes them).
LOCAL_OK = (
    "\x1b[2m2026-12-01 15:42:55\x1b[0m \x1b[32m INFO\x1b[0m smg::tokenizer::registry: Loading tokenizer "
    "'/var/cache/knobfleet/vllm-0.32.0/model/tiny-llama' from source: "
    "/var/cache/knobfleet/vllm-0.32.0/model/tiny-llama\n"
    "2026-12-01 15:42:48  INFO smg::server: Starting router on 127.0.0.1:30080\n"
    "2026-12-01 15:42:48  WARN Health check failed: error sending request for url (http://127.0.1.2:30000/health)\n"
)


@pytest.mark.parametrize(
    "line",
    [
        "INFO smg::tokenizer: Downloading tokenizer 'tiny' from HuggingFace Hub",
        "WARN request to https://huggingface.co/api/models/tiny failed",
        "ERROR hf_hub: offline mode is enabled",
        "INFO fetching https://hf-mirror.com/tiny/tokenizer.json",
        "error sending request for url (https://10.1.2.3/x)",
    ],
)
def test_download_attempts_are_found(line: str) -> None:
    assert download_attempts(LOCAL_OK + line + "\n") == [line]


def test_a_local_load_is_no_download() -> None:
    assert download_attempts(LOCAL_OK) == []


@pytest.mark.parametrize(
    ("address", "loopback"),
    [("http://127.0.1.2:30000", True), ("127.0.0.1", True), ("http://localhost:1/x", True),
     ("http://10.0.0.1:30000", False), ("http://127.example.org:1", False), ("0.0.0.0", False)],
)  # fmt: skip
def test_is_loopback(address: str, loopback: bool) -> None:
    assert is_loopback(address) is loopback


def test_router_argv_binds_loopback_and_refuses_other_workers() -> None:
    argv = router_argv("/r", ["http://127.0.1.1:30000", "http://127.0.1.2:8000"], 30080, 30081)
    assert argv[:6] == ["/r", "launch", "--host", "127.0.0.1", "--port", "30080"]
    assert argv[argv.index("--prometheus-host") + 1] == "127.0.0.1"
    assert argv[argv.index("--worker-urls") + 1 : argv.index("--policy")] == ["http://127.0.1.1:30000",
                                                                          "http://127.0.1.2:8000"]  # fmt: skip
    with pytest.raises(LabError, match=r"http://10\.0\.0\.9:1 are not loopback addresses"):
        router_argv("/r", ["http://127.0.1.1:30000", "http://10.0.0.9:1"])


def test_router_env_is_offline_without_proxies(tmp_path: object) -> None:
    env = router_env({"PATH": "/bin", "https_proxy": "http://p:3128", "HF_HUB_OFFLINE": "0"}, tmp_path)  # type: ignore[arg-type]
    assert env["HF_HUB_OFFLINE"] == "1" and env["TRANSFORMERS_OFFLINE"] == "1" and env["HF_HOME"] == str(tmp_path)
    assert "https_proxy" not in env and env["PATH"] == "/bin"


def test_router_group_vars_feed_the_host_var_model() -> None:
    import yaml

    data = yaml.safe_load(router_group_vars("/var/cache/knobfleet/vllm-0.32.0/model/tiny-llama", 30080))
    hv = from_inventory_vars("lab1", data, "inventory")
    assert (hv.router_url, hv.router_kind, hv.drain_timeout_s, hv.router_max_unavailable) == (
        "http://127.0.0.1:30080", "sglang", 30, "1",
    )  # fmt: skip
    assert hv.model_path.endswith("/tiny-llama")


def test_router_install_layout_and_stamp(tmp_path: object) -> None:
    inst = router_install.layout("0.3.2", tmp_path)  # type: ignore[arg-type]
    assert inst.router.name == "sglang-router" and inst.root.name == "sglang-router-0.3.2"
    assert not router_install.is_installed(inst)
    inst.router.parent.mkdir(parents=True)
    inst.python.write_text("")
    inst.router.write_text("")
    (inst.root / "installed.json").write_text('{"package": "sglang-router", "recipe": 1, "version": "0.3.2"}')
    assert router_install.is_installed(inst)
    (inst.root / "installed.json").write_text('{"package": "sglang-router", "recipe": 0, "version": "0.3.2"}')
    assert not router_install.is_installed(inst)


def test_each_router_kind_has_its_own_pinned_install(tmp_path: object) -> None:
    smg = router_install.layout(None, tmp_path, "smg")  # type: ignore[arg-type]
    assert (smg.package, smg.version, smg.root.name, smg.router.name) == ("smg", "1.13.0", "smg-1.13.0", "smg")
    assert router_install.stamp(smg) == {"package": "smg", "version": "1.13.0", "recipe": router_install.RECIPE}
    old = router_install.layout(None, tmp_path)  # type: ignore[arg-type]
    assert (old.package, old.version) == ("sglang-router", "0.3.2") and old.root != smg.root
    import pytest

    from knobfleet.errors import LabError

    with pytest.raises(LabError, match=r"^lab router: unknown kind 'nginx'; known: sglang-router, smg$"):
        router_install.layout(None, tmp_path, "nginx")  # type: ignore[arg-type]
