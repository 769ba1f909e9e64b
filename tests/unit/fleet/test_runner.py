"""The extra-vars file: profile data reaches Ansible tagged !unsafe, so it is never templated."""

from __future__ import annotations

from typing import Any

import pytest
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


# --- folding ansible-runner events into per-host results ------------------------------------------------------

from knobfleet.fleet.runner import RunResult, fold_event  # noqa: E402


def _event(kind: str, res: dict[str, Any], task: str = "T", action: str = "knob_generation") -> dict[str, Any]:
    return {"event": kind, "event_data": {"host": "h1", "task": task, "task_action": action, "res": res}}


def _fold(*events: dict[str, Any]) -> RunResult:
    from pathlib import Path

    result = RunResult("r", 0, "", {}, Path("/nonexistent"), 0.0)
    for e in events:
        fold_event(result, e)
    return result


def test_results_are_keyed_by_step_else_by_module() -> None:
    hr = _fold(
        _event("runner_on_ok", {"step": "ready", "main_pid": 7}),
        _event("runner_on_ok", {"content": "eA=="}, action="ansible.builtin.slurp"),
    ).host("h1")
    assert hr.results == {"ready": {"step": "ready", "main_pid": 7}, "ansible.builtin.slurp": {"content": "eA=="}}


def test_a_composite_call_is_keyed_like_its_steps_with_its_diff() -> None:
    diff = [{"before_header": "/s", "after_header": "/s", "before": "a", "after": "b"}]
    res = {"step": "install", "changed": True, "steps": {"begin": {"locked": True}, "stage": {"diff": diff}}}
    hr = _fold(_event("runner_on_ok", {**res, "diff": diff})).host("h1")
    assert hr.results["begin"] == {"locked": True} and hr.results["stage"] == {"diff": diff}
    assert hr.results["install"]["step"] == "install"
    assert hr.diffs == [{"step": "install", **diff[0]}]


def test_a_failed_composite_is_keyed_by_the_step_that_failed() -> None:
    res = {"step": "install", "failed": True, "failed_step": "begin", "msg": "locked by bob", "lock_held": True}
    hr = _fold(_event("runner_on_failed", {**res, "steps": {}}, task="Install")).host("h1")
    assert hr.results["begin"]["lock_held"] and "install" not in hr.results
    assert hr.failures == [("Install", "locked by bob")]
    later = {"step": "install", "failed": True, "failed_step": "stage", "msg": "bash -n", "steps": {"begin": {}}}
    hr = _fold(_event("runner_on_failed", later)).host("h1")
    assert set(hr.results) == {"begin", "stage"}


def test_ignored_failures_and_unreachable_hosts() -> None:
    ignored = _event("runner_on_failed", {"msg": "x"})
    ignored["event_data"]["ignore_errors"] = True
    hr = _fold(ignored).host("h1")
    assert not hr.failures and hr.results == {}
    hr = _fold(_event("runner_on_unreachable", {"msg": "ssh: connect refused"})).host("h1")
    assert hr.unreachable and hr.first_failure() == "T: unreachable: ssh: connect refused"


@pytest.mark.parametrize(
    ("environ", "want"),
    [
        ({"ANSIBLE_VAULT_PASSWORD_FILE": "vault.pass"}, {"ANSIBLE_VAULT_PASSWORD_FILE": "/home/op/fleet/vault.pass"}),
        ({"ANSIBLE_VAULT_PASSWORD_FILE": "../v/p"}, {"ANSIBLE_VAULT_PASSWORD_FILE": "/home/op/v/p"}),
        ({"ANSIBLE_VAULT_PASSWORD_FILE": "/etc/p"}, {"ANSIBLE_VAULT_PASSWORD_FILE": "/etc/p"}),
        ({"ANSIBLE_VAULT_IDENTITY_LIST": "dev@pw,prod@prompt,/abs/x,rel"},
         {"ANSIBLE_VAULT_IDENTITY_LIST": "dev@/home/op/fleet/pw,prod@prompt,/abs/x,/home/op/fleet/rel"}),
        ({"ANSIBLE_VAULT_IDENTITY_LIST": "a@b@c"}, {"ANSIBLE_VAULT_IDENTITY_LIST": "a@/home/op/fleet/b@c"}),
        ({"PATH": "/bin"}, {}),
    ],
    ids=["relative-file", "dotdot", "absolute", "ids", "at-in-source", "none"],
)  # fmt: skip
def test_a_relative_vault_source_is_made_absolute_for_ansible_playbook(
    environ: dict[str, str], want: dict[str, str]
) -> None:
    """ansible-playbook runs in the run's own folder: a source relative to where knobfleet started would be
    'not found' there (found by the attack harness)."""
    from knobfleet.fleet.runner import vault_sources

    assert vault_sources(environ, "/home/op/fleet") == want


@pytest.mark.parametrize(
    ("output", "want"),
    [
        ("[WARNING]: Error in vault password file loading (default): A vault password\nmust be specified\n"
         "ERROR! A vault password must be specified to decrypt data in file /p/x.pw\n\n",
         "A vault password must be specified to decrypt data in file /p/x.pw"),
        ("something\nthe last line\n", "the last line"),
        ("", "no output"),
        ("ERROR! \x1b[31mred\n", "'\\x1b[31mred'"),
        ("ERROR! " + "x" * 400, "x" * 297 + "..."),
    ],
    ids=["error-line", "last-line", "empty", "escaped", "cut"],
)  # fmt: skip
def test_ansible_playbooks_fatal_error_is_one_line(output: str, want: str) -> None:
    from knobfleet.fleet.runner import fatal

    assert fatal(output) == want
