"""Rendering a rank of an engine group: knobfleet adds the rank's flags (SGLang's and vLLM's spellings), and a
profile or host var that sets one of them is refused naming the group; the inventory reader's checks of the
declaration (one declaration, every member sees it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from knobfleet.errors import RenderError
from knobfleet.fleet.hostvars import HostVars, attach_groups
from knobfleet.groups import GroupError
from knobfleet.profiles.model import Profile
from knobfleet.render import render_host

DECL = {"g": {"members": {"a": 0, "b": 1}, "dist_port": 5100}}
ADDR = {"a": "127.0.2.1", "b": "127.0.2.2", "c": "127.0.2.3"}


def hosts(decl: object = DECL, **extra: object) -> list[HostVars]:
    hs = [HostVars(host=h, address=ADDR[h], listen_host=ADDR[h], **extra) for h in ("a", "b")]  # type: ignore[arg-type]
    return attach_groups(hs, dict.fromkeys(("a", "b"), decl), ADDR, "inv")


def profile(engine: str = "sglang", args: dict[str, str | bool] | None = None) -> Profile:
    return Profile(name="p", version=1, engine=engine, env={}, args=args or {})


def test_each_rank_gets_its_flags_in_the_script_and_the_expected_argv() -> None:
    a, b = (render_host(profile(), hv) for hv in hosts())
    assert "--nnodes=2" in a.argv and "--node-rank=0" in a.argv and "--dist-init-addr=127.0.2.1:5100" in a.argv
    assert "--node-rank=1" in b.argv and "--dist-init-addr=127.0.2.1:5100" in b.argv
    assert "'--node-rank=1'" in b.script or "--node-rank=1" in b.script


def test_vllm_ranks_get_master_addr_and_headless_followers() -> None:
    a, b = (render_host(profile("vllm"), hv.model_copy(update={"port": 8000})) for hv in hosts())
    assert "--master-addr=127.0.2.1" in a.argv and "--headless" not in a.argv
    assert "--headless" in b.argv and "--node-rank=1" in b.argv and "--master-port=5100" in b.argv


@pytest.mark.parametrize("flag", ["nnodes", "node-rank", "dist-init-addr", "nccl-init-addr"])
def test_a_profile_setting_a_rank_flag_is_refused(flag: str) -> None:
    with pytest.raises(RenderError, match=f"flag --{flag} is set by the profile p on host a, a rank of engine group g"):
        render_host(profile(args={flag: "1"}), hosts()[0])


def test_a_host_arg_setting_a_rank_flag_is_refused() -> None:
    (a, _) = hosts(host_args={"node-rank": "3"})
    with pytest.raises(RenderError, match="flag --node-rank is set by knob_serve_host_args on host a"):
        render_host(profile(), a)


def test_a_host_alone_renders_no_rank_flag() -> None:
    r = render_host(profile(), HostVars(host="c", listen_host="127.0.2.3"))
    assert not any(t.startswith(("--nnodes", "--node-rank")) for t in r.argv)


def test_declarations_that_differ_between_hosts_are_refused() -> None:
    hs = [HostVars(host=h, address=ADDR[h]) for h in ("a", "b")]
    other = {"g": {"members": {"a": 0, "b": 1}, "dist_port": 5200}}
    with pytest.raises(GroupError, match="knob_engine_groups differs between hosts a and b; declare it once"):
        attach_groups(hs, {"a": DECL, "b": other}, ADDR, "inv")


@pytest.mark.parametrize(
    ("decl", "message"),
    [
        ({"g": {"members": {"a": 0, "b": 0}}}, "inv: knob_engine_groups.g: a and b both claim rank 0"),
        ({"g": {"members": {"a": 0, "b": 2}}}, "inv: knob_engine_groups.g: rank 1 is missing"),
        ({"g": {"members": {"a": 0, "zz": 1}}}, "inv: knob_engine_groups.g.members.zz: not a host of this inventory"),
        (
            {"g": {"members": {"a": 0, "b": 1}, "dist_init_addr": "127.0.9.9"}},
            "inv: knob_engine_groups.g.dist_init_addr: '127.0.9.9' is not the address of one of the group's hosts",
        ),
        (
            {"g": {"members": {"a": 0}}, "h": {"members": {"a": 0, "b": 1}}},
            "inv: a: in two engine groups (g, h); a host runs one engine",
        ),
    ],
)
def test_bad_declarations_are_one_line_each(decl: object, message: str) -> None:
    with pytest.raises(GroupError) as info:
        hosts(decl)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_render_vars_carries_each_ranks_flags_for_plain_ansible_playbook(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`render --what vars -i INV`: the extra vars a plain ansible-playbook needs, knob_serve_groups included (the
    role's vars/main.yml reads each rank's flags from it), so a rank renders its own --node-rank there too."""
    import yaml

    from knobfleet import cli

    inv = tmp_path / "inv"
    (inv / "group_vars" / "all").mkdir(parents=True)
    hosts_yml = "".join(
        f"    {h}:\n      ansible_host: {a}\n      knob_serve_listen_host: {a}\n" for h, a in ADDR.items()
    )
    (inv / "hosts.yml").write_text("all:\n  hosts:\n" + hosts_yml)
    (inv / "group_vars" / "all" / "groups.yml").write_text(yaml.safe_dump({"knob_engine_groups": DECL}))
    assert cli.run(["render", "ctas512", "--what", "vars", "-i", str(inv)]) == 0
    loader = type("L", (yaml.SafeLoader,), {})
    loader.add_constructor("!unsafe", lambda ld, node: ld.construct_scalar(node))  # type: ignore[arg-type]
    doc = yaml.load(capsys.readouterr().out, Loader=loader)
    groups = doc["knob_serve_groups"]
    assert sorted(groups) == ["a", "b"], "c is in no group"
    assert groups["b"]["name"] == "g" and groups["b"]["hosts"] == ["a", "b"]
    assert groups["b"]["args"] == {"nnodes": "2", "node-rank": "1", "dist-init-addr": "127.0.2.1:5100"}
    assert doc["knob_serve_profile"]["name"] == "ctas512"
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "hosts.yml").write_text("all:\n  hosts:\n    c:\n      ansible_host: 127.0.2.3\n")
    assert cli.run(["render", "ctas512", "--what", "vars", "-i", str(plain)]) == 0
    assert "knob_serve_groups" not in capsys.readouterr().out
