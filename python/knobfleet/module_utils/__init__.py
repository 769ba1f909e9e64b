"""Code the on-host Ansible modules share, standard library only.

The same files are ``ansible.module_utils.knob_*`` for the roles' modules (knobfleet points Ansible's
module_utils path here) and ``knobfleet.module_utils.knob_*`` for the controller, so the live-state rule
and the readers of /proc, cgroups and serve scripts exist once."""
