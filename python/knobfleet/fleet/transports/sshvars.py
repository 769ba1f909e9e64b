"""The host keys the ssh transport reads, as a typed record with Ansible's defaults: what ``ssh.ineligible``
and ``sshcalls.ssh_argv`` read of a host (through ``base.host_view``), and, as field names, the transport's
``reads``. Standard library only; its own module so that ssh.py and sshcalls.py both import it without
importing each other."""

from __future__ import annotations

from knobfleet.fleet.transports.base import Reach


class SshVars(Reach):
    """The host keys the fast path reads (``ssh_argv``, the interpreter, ``ineligible``), with the defaults
    Ansible's ssh plugin takes for them. A password is only seen as set (``<set>``): the fast path never sends
    one, so a host with one is ineligible."""

    ansible_user: str = ""
    ansible_ssh_user: str = ""
    ansible_ssh_private_key_file: str = ""
    ansible_private_key_file: str = ""
    ansible_ssh_executable: str = "ssh"
    ansible_ssh_args: str | None = None  # None: knobfleet's own (ansible_cfg.SSH_ARGS), as Ansible is given
    ansible_ssh_common_args: str = ""
    ansible_ssh_extra_args: str = ""
    ansible_password: str = ""
    ansible_ssh_pass: str = ""
    ansible_ssh_password: str = ""
    ansible_become_password: str = ""

    @property
    def user(self) -> str:
        return self.ansible_user or self.ansible_ssh_user

    @property
    def key_file(self) -> str:
        return self.ansible_ssh_private_key_file or self.ansible_private_key_file

    @property
    def password(self) -> bool:
        return "<set>" in (self.ansible_password, self.ansible_ssh_pass, self.ansible_ssh_password,
                           self.ansible_become_password)  # fmt: skip
