"""Commands that act on hosts: lab, apply/plan. Registered into the main parser by ``cli``."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    return None
