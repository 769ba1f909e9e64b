"""The extra-vars file: profile data reaches Ansible tagged !unsafe, so it is never templated."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from knobfleet.fleet.runner import dump_vars


def ansible_load(text: str) -> Any:
    from ansible.parsing.yaml.loader import AnsibleLoader

    return AnsibleLoader(text).get_single_data()


def test_profile_strings_are_unsafe_and_trusted_vars_are_not() -> None:
    from ansible.utils.unsafe_proxy import AnsibleUnsafeText

    payload = "{{ lookup('pipe','touch /tmp/knobfleet-pwned') }}"
    text = dump_vars({"knob_serve_run_id": "r1"}, {"knob_serve_profile": {"env": {"X": payload}, "args": {"y": True}}})
    data = ansible_load(text)
    value = data["knob_serve_profile"]["env"]["X"]
    assert value == payload and isinstance(value, AnsibleUnsafeText)
    assert data["knob_serve_profile"]["args"]["y"] is True
    assert not isinstance(data["knob_serve_run_id"], AnsibleUnsafeText)


def test_templar_leaves_unsafe_values_alone() -> None:
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar

    data = ansible_load(dump_vars({}, {"p": {"env": {"X": "{{ 7 * 6 }}"}}}))
    templar = Templar(loader=DataLoader(), variables=data)
    assert templar.template("{{ p.env.X }}") == "{{ 7 * 6 }}"


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=200))
def test_any_text_round_trips_through_the_vars_file(value: str) -> None:
    data = ansible_load(dump_vars({}, {"p": {"env": {"X": value}}}))
    assert data["p"]["env"]["X"] == value
