"""One exception tree; each error carries the exit code the CLI returns for it (DESIGN.md, Contracts)."""

from __future__ import annotations

from typing import Any

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_DRIFT = 2
EXIT_RESTORE_FAILED = 3
EXIT_UNREACHABLE = 4
EXIT_DRIFT_AND_UNREACHABLE = 6
EXIT_USAGE = 64  # sysexits.h EX_USAGE: a bad command line, never confused with 2 (drift / changes pending)
EXIT_INTERRUPTED = 130


class KnobfleetError(Exception):
    """Base of every error knobfleet reports to an operator. The message is the whole story."""

    exit_code = EXIT_ERROR


class UsageError(KnobfleetError):
    """The command line itself is wrong (unknown option value, missing argument)."""

    exit_code = EXIT_USAGE


class ProfileError(KnobfleetError):
    """One or more problems in profile or catalog files; one line per problem."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


class InventoryError(KnobfleetError):
    """The inventory is missing, unreadable, or a host's vars are invalid."""


class RenderError(KnobfleetError):
    """A profile and a host's vars cannot be combined (e.g. the same key set in both)."""


class LabError(KnobfleetError):
    """The lab cannot be booted, reached or torn down."""


class RunError(KnobfleetError):
    """An Ansible run failed on one or more hosts."""


class ApplyFailed(KnobfleetError):
    """An apply failed on a host; details say what and where."""


class LockHeld(KnobfleetError):
    """Another applier holds the host lock; ``report`` has what happened on every host."""

    def __init__(self, message: str, report: Any = None) -> None:
        super().__init__(message)
        self.report = report
