"""Code the on-host Ansible modules share, standard library only.

The same files are ``ansible.module_utils.knob_*`` for the roles' modules (knobfleet points Ansible's
module_utils path here) and ``knobfleet.module_utils.knob_*`` for the controller, so the live-state rule
and the readers of /proc, cgroups and serve scripts exist once. They import each other relatively
(``from .knob_lean import loads``), which resolves in either package, in the collection's copy and in the fast
path's bootstrap (which registers each file as ``ansible.module_utils.<name>``)."""
