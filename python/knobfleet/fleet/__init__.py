"""The fleet: inventory, host vars, how knobfleet reaches hosts (transports) and runs Ansible (runner)."""
