"""Engine group declarations: every bad declaration is one line at plan time; per-rank flags; restart units."""

from __future__ import annotations

from typing import Any

import pytest

from knobfleet.engines.adapter import engine
from knobfleet.groups import GroupError, parse, rank_flags, units

ADDR = {f"lab{i}": f"127.0.1.{i}" for i in range(1, 6)}


def test_two_tp_groups_and_a_pd_pair() -> None:
    groups = parse(
        {
            "a": {"members": {"lab2": 1, "lab1": 0}},
            "b": {"members": {"lab3": 0, "lab4": 1}, "dist_port": 5100},
        },
        ADDR,
    )
    a, b = groups
    assert [m.host for m in a.members] == ["lab1", "lab2"] and a.head.host == "lab1"
    sglang, vllm = engine("sglang").ranks("a test"), engine("vllm").ranks("a test")  # the catalogs' serve.ranks
    assert rank_flags(a, "lab2", sglang) == {"nnodes": "2", "node-rank": "1", "dist-init-addr": "127.0.1.1:5000"}
    assert rank_flags(b, "lab4", vllm) == {
        "nnodes": "2",
        "node-rank": "1",
        "master-addr": "127.0.1.3",
        "master-port": "5100",
        "headless": True,
    }
    assert "headless" not in rank_flags(b, "lab3", vllm)
    (pd,) = parse({"p": {"kind": "pd", "members": {"lab5": "decode", "lab1": "prefill"}}}, ADDR)
    assert [(m.host, m.role) for m in pd.members] == [("lab1", "prefill"), ("lab5", "decode")]
    assert rank_flags(pd, "lab5", sglang) == {}


def test_rank_flags_are_the_catalogs_data_and_an_engine_without_them_is_refused() -> None:
    """Issue 36: an engine's rank flags are data (catalog serve.ranks), filled in per rank; an engine whose catalog
    has none is refused in one line where a tensor-parallel group needs them, never given another engine's."""
    from dataclasses import replace

    from knobfleet.errors import KnobfleetError
    from knobfleet.render import rank_spec

    (g,) = parse({"g": {"members": {"lab1": 0, "lab2": 1, "lab3": 2}, "dist_port": 6000}}, ADDR)
    spec = ({"world": "{nnodes}", "me": "r{rank}", "join": "tcp://{head}:{port}"}, {"follower": True})
    assert rank_flags(g, "lab1", spec) == {"world": "3", "me": "r0", "join": "tcp://127.0.1.1:6000"}
    assert rank_flags(g, "lab3", spec) == {"world": "3", "me": "r2", "join": "tcp://127.0.1.1:6000", "follower": True}
    bare = replace(engine("sglang"), name="newengine", rank_spec=None)
    with pytest.raises(KnobfleetError) as exc:
        rank_spec(g, bare)
    assert str(exc.value) == (
        "engine newengine: engine group g needs how its ranks find each other, and its catalog has no serve.ranks; "
        "add flags (with {nnodes}, {rank}, {head}, {port}) and follower_flags under serve: in "
        "profiles/catalogs/newengine.overlay.yaml"
    )
    (pd,) = parse({"p": {"kind": "pd", "members": {"lab5": "decode", "lab1": "prefill"}}}, ADDR)
    assert rank_spec(pd, bare) == ({}, {})  # a prefill/decode pair needs none


@pytest.mark.parametrize(
    ("declared", "message"),
    [
        ({"a": {"members": {"lab1": 0, "lab3": 2}}}, "knob_engine_groups.a: rank 1 is missing (ranks 0, 2 declared)"),
        (
            {"a": {"members": {"lab1": 0, "lab2": 1, "lab3": 1}}},
            "knob_engine_groups.a: lab2 and lab3 both claim rank 1",
        ),
        (
            {"a": {"members": {"lab1": 0, "lab2": 1}, "dist_init_addr": "10.0.0.9"}},
            "knob_engine_groups.a.dist_init_addr: '10.0.0.9' is not the address of one of the group's hosts",
        ),
        (
            {"a": {"members": {"lab1": 0, "lab2": 1}, "dist_init_addr": "127.0.1.2"}},
            "knob_engine_groups.a.dist_init_addr: 127.0.1.2 is lab2's, not rank 0's (lab1, 127.0.1.1)",
        ),
        (
            {"a": {"members": {"lab1": 0, "lab2": 1}}, "b": {"members": {"lab2": 0, "lab3": 1}}},
            "lab2: in two engine groups (a, b); a host runs one engine",
        ),
        ({"a": {"members": {"lab9": 0}}}, "knob_engine_groups.a.members.lab9: not a host of this inventory"),
        ({"a": {"members": {"lab1": "0"}}}, "knob_engine_groups.a.members.lab1: '0': a rank 0, 1, 2"),
        ({"a": {"members": {"lab1": True}}}, "knob_engine_groups.a.members.lab1: True: a rank 0, 1, 2"),
        ({"a": {"members": {}}}, "knob_engine_groups.a: members: give each host its rank"),
        ({"a": {"members": {"lab1": 0}, "ports": 1}}, "knob_engine_groups.a.ports: unknown key"),
        ({"a": {"kind": "ep", "members": {"lab1": 0}}}, "knob_engine_groups.a.kind: 'ep': tp"),
        ({"a": {"members": {"lab1": 0}, "dist_port": 0}}, "knob_engine_groups.a.dist_port: 0: a port number"),
        ({"a": {"kind": "pd", "members": {"lab1": "prefill"}}}, "knob_engine_groups.a: no decode host"),
        ({"a": {"kind": "pd", "members": {"lab1": 0}}}, "knob_engine_groups.a.members.lab1: 0: prefill or decode"),
        (["a"], "knob_engine_groups: must be a mapping"),
    ],
)
def test_bad_declarations_are_one_line(declared: Any, message: str) -> None:
    with pytest.raises(GroupError) as info:
        parse(declared, ADDR)
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)


def test_serial_counts_groups_and_a_limit_must_take_a_whole_group() -> None:
    groups = parse({"a": {"members": {"lab2": 0, "lab4": 1}}}, ADDR)
    plan = units(["lab1", "lab2", "lab3", "lab4"], groups)
    assert plan.units == (("lab1",), ("lab2", "lab4"), ("lab3",))
    assert plan.names == ("lab1", "a", "lab3")
    with pytest.raises(GroupError, match=r"^group a: --limit leaves out lab4; a group restarts as a unit"):
        units(["lab1", "lab2"], groups)
