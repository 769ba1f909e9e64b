"""The one reader of an engine's command line: an exec argv -> the flags the engine's argparse parser sees.

Shared by ``plan`` (knob-level changes), the live-state rule (``knob_live``: the engine's own report of its
arguments against the flags it was started with) and ``render`` (conflicts between host and profile flags).
Standard library only: the controller imports it as ``knobfleet.module_utils.knob_argv``, the roles' modules
as ``ansible.module_utils.knob_argv`` (shipped next to ``knob_live``).

It reads an argv the way argparse (Python 3.11, what both engines use) reads it, given the engine's flag table
(the *spec*, built from its catalog by ``build_spec``):

* ``--name=value`` and ``--name value``; each flag's arity from the catalog: 0 (a switch), 1, ``?`` (value
  optional), ``+``/``*`` (a list), or a count;
* aliases (``--tensor-parallel-size`` for ``--tp-size``, vLLM's ``-tp``), negations (``--no-enable-x``) and
  argparse's unique-prefix abbreviations (``--tp`` for ``--tp-size``; an ambiguous prefix is an error, as
  argparse refuses it);
* a value that starts with ``-`` is a value when it is a negative number (``--chunked-prefill-size -1``) or
  attached with ``=`` (``--x=-y``); otherwise argparse reads it as an option, and so does this reader;
* ``--`` ends the options; the engine's positional model (vLLM's ``serve MODEL``) is reported under the
  spec's ``positional`` name;
* engines whose parser folds ``_`` into ``-`` in option names (vLLM) are read that way (``underscores``).

Without a spec (an engine rule from an older controller) a ``--name`` followed by a word that does not start
with ``--`` takes it as its value, and a bare ``--name`` is a switch: right for the usual spellings, not for
every one (``--enforce-eager MODEL``).

The spec is plain JSON (it travels to the hosts in the engine rule ``argv``)::

    {"flags": {"tp-size": "1", "enable-x": "0", ...},      # arity: "0" "1" "?" "+" "*" or a count
     "aliases": {"tensor-parallel-size": "tp-size", "-tp": "tp-size", ...},   # long names without "--"
     "negations": {"no-enable-x": "enable-x"},
     "subcommand": "serve" | null, "positional": "model" | null, "underscores": false, "abbrev": true}
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")  # argparse's _negative_number_matcher
ARITIES = ("0", "1", "?", "+", "*")
TRUE, FALSE = "true", "false"


class Argv(NamedTuple):
    """One argv as the engine reads it. ``flags``: canonical flag name -> value (``true``/``false`` for a
    switch, a list's items joined by one space); ``spelled``: canonical name -> the option as written;
    ``errors``: what argparse would refuse (the reader still reads on, as leniently as it can)."""

    head: list[str]
    flags: dict[str, str]
    spelled: dict[str, str]
    positionals: list[str]
    errors: list[str]


def arity_of(knob: dict[str, Any]) -> str:
    """A catalog flag knob's arity code: its ``nargs`` where the catalog records one, else 0 for a switch
    (``type: bool``: store_true / BooleanOptionalAction) and 1 for a valued flag."""
    nargs = knob.get("nargs")
    if nargs is None:
        return "0" if knob.get("type") == "bool" else "1"
    text = str(nargs)
    if text in ARITIES or text.isdigit():
        return text
    return "1"


def build_spec(
    knobs: dict[str, dict[str, Any]],
    subcommand: str | None = None,
    positional: str | None = None,
    underscores: bool = False,
    abbrev: bool = True,
) -> dict[str, Any]:
    """The reader's spec from catalog flag knobs (``name -> {type, nargs, aliases, negation}``)."""
    flags: dict[str, str] = {}
    aliases: dict[str, str] = {}
    negations: dict[str, str] = {}
    for name in sorted(knobs):
        knob = knobs[name]
        flags[name] = arity_of(knob)
        for alias in knob.get("aliases") or ():
            if alias != name:
                aliases[str(alias)] = name
        if knob.get("negation"):
            negations[str(knob["negation"])] = name
    return {
        "flags": flags,
        "aliases": aliases,
        "negations": negations,
        "subcommand": subcommand,
        "positional": positional,
        "underscores": underscores,
        "abbrev": abbrev,
    }


def _option(name: str) -> str:
    """A catalog name as an option string: ``tp-size`` -> ``--tp-size``; ``-tp`` stays as it is."""
    return name if name.startswith("-") else "--" + name


def options_of(spec: dict[str, Any]) -> dict[str, tuple[str, str, bool]]:
    """Every option string the engine's parser registers -> (canonical flag, arity, negated)."""
    flags: dict[str, str] = spec.get("flags") or {}
    out: dict[str, tuple[str, str, bool]] = {}
    for name, arity in flags.items():
        out[_option(name)] = (name, str(arity), False)
    for alias, name in (spec.get("aliases") or {}).items():
        if name in flags:
            out.setdefault(_option(alias), (name, str(flags[name]), False))
    for negation, name in (spec.get("negations") or {}).items():
        if name in flags:
            out.setdefault(_option(negation), (name, "0", True))
    return out


def head_length(argv: list[str], spec: dict[str, Any] | None) -> int:
    """How many leading words are the launcher, not the engine's arguments: up to the engine's subcommand
    (``vllm serve``), else up to ``-m MODULE`` (``python3 -m sglang.launch_server``), else the program."""
    sub = (spec or {}).get("subcommand")
    if sub and sub in argv:
        return argv.index(sub) + 1
    for i, word in enumerate(argv[:8]):
        if word.startswith("--"):
            break
        if word == "-m" and i + 1 < len(argv):
            return i + 2
    return min(1, len(argv))


class _Reader:
    def __init__(self, spec: dict[str, Any] | None) -> None:
        self.spec = spec
        self.options = options_of(spec) if spec else {}
        self.negative_options = any(NEGATIVE_NUMBER.match(o) for o in self.options)
        self.abbrev = bool((spec or {}).get("abbrev", True))
        self.underscores = bool((spec or {}).get("underscores"))
        self.errors: list[str] = []

    def normal(self, word: str) -> str:
        if self.underscores and word.startswith("--"):
            name, sep, value = word.partition("=")
            return name.replace("_", "-") + sep + value
        return word

    def parse_optional(self, word: str) -> tuple[tuple[str, str, bool] | None, str, str | None] | None:
        """argparse's ``_parse_optional``: None for a positional word, else (the option's entry or None when the
        parser has no such option, the option string, an explicit value)."""
        if not word or word[0] != "-":
            return None
        if not self.spec:  # no flag table: every --word is an option, a word with one dash a value
            if not word.startswith("--"):
                return None
            name, sep, value = word.partition("=")
            return None, name, value if sep else None
        if word in self.options:
            return self.options[word], word, None
        if len(word) == 1:
            return None
        if "=" in word:
            name, value = word.split("=", 1)
            if name in self.options:
                return self.options[name], name, value
        matches = self.prefix_matches(word)
        if len(matches) > 1:
            self.errors.append(
                "ambiguous option: %s could match %s" % (word.split("=", 1)[0], ", ".join(m[1] for m in matches))
            )
            return matches[0]
        if len(matches) == 1:
            return matches[0]
        if NEGATIVE_NUMBER.match(word) and not self.negative_options:
            return None
        if " " in word:
            return None
        name, sep, value = word.partition("=")
        return None, name, value if sep else None

    def prefix_matches(self, word: str) -> list[tuple[tuple[str, str, bool] | None, str, str | None]]:
        out: list[tuple[tuple[str, str, bool] | None, str, str | None]] = []
        if word.startswith("--"):
            if not self.abbrev:
                return out
            prefix, sep, value = word.partition("=")
            for option in self.options:
                if option.startswith(prefix):
                    out.append((self.options[option], option, value if sep else None))
        else:  # a single-dash option: -Xvalue for a one-letter option, or a prefix of a longer one
            for option in self.options:
                if option == word[:2]:
                    out.append((self.options[option], option, word[2:]))
                elif option.startswith(word):
                    out.append((self.options[option], option, None))
        return out


def read(argv: list[str], spec: dict[str, Any] | None = None) -> Argv:
    """``argv`` (an exec line: launcher, then the engine's arguments) as the engine's parser reads it."""
    r = _Reader(spec)
    start = head_length(argv, spec)
    words = [r.normal(w) for w in argv[start:]]
    kinds: list[Any] = []  # per word: None (a positional word), "--", or parse_optional's tuple
    ended = False
    for word in words:
        if ended:
            kinds.append(None)
        elif word == "--":
            kinds.append("--")
            ended = True
        else:
            kinds.append(r.parse_optional(word))
    flags: dict[str, str] = {}
    spelled: dict[str, str] = {}
    positionals: list[str] = []

    def takes_value(j: int) -> bool:
        return j < len(words) and kinds[j] is None

    i = 0
    while i < len(words):
        kind = kinds[i]
        if kind is None:
            positionals.append(words[i])
            i += 1
            continue
        if kind == "--":
            i += 1
            continue
        entry, option, explicit = kind
        i += 1
        if entry is None:
            if spec:
                r.errors.append("unrecognized argument %s" % option)
            name, arity, negated = option.lstrip("-"), ("1" if takes_value(i) or explicit is not None else "0"), False
        else:
            name, arity, negated = entry
        values: list[str] = []
        if arity == "0":
            if explicit is not None:
                r.errors.append("%s takes no value (given %r)" % (option, explicit))
            value = FALSE if negated else TRUE
        elif explicit is not None:
            value = explicit
        elif arity in ("1", "?") or arity.isdigit():
            count = 1 if arity == "?" else int(arity)
            while len(values) < count and takes_value(i):
                values.append(words[i])
                i += 1
            if arity != "?" and len(values) < count:
                r.errors.append("%s expects %s" % (option, "one value" if count == 1 else "%d values" % count))
            value = " ".join(values) if values else (TRUE if arity == "?" else "")
        else:  # + or *
            while takes_value(i):
                values.append(words[i])
                i += 1
            if arity == "+" and not values:
                r.errors.append("%s expects at least one value" % option)
            value = " ".join(values)
        flags[name] = value
        spelled[name] = option
    pos_name = (spec or {}).get("positional")
    if pos_name and positionals:
        flags[str(pos_name)] = positionals[0]
        spelled[str(pos_name)] = "(positional)"
    extra = positionals[1:] if pos_name else positionals
    if not pos_name and "--" in kinds:  # argparse (3.11) leaves a "--" no positional consumes as an extra
        extra = ["--", *extra]
    if spec and extra:
        r.errors.append("unrecognized arguments: %s" % " ".join(extra))
    return Argv(list(argv[:start]), flags, spelled, positionals, r.errors)


def flags_of(argv: list[str], spec: dict[str, Any] | None = None) -> dict[str, str]:
    """The flags of an exec argv by canonical name (see ``read``)."""
    return read(argv, spec).flags


def canonical(name: str, spec: dict[str, Any] | None) -> str | None:
    """The flag a profile or host var key names (``tp`` -> ``tp-size``, ``tensor-parallel-size`` -> ``tp-size``);
    None when the engine has no such flag or the prefix is ambiguous; ``name`` itself without a spec."""
    if not spec:
        return name
    r = _Reader(spec)
    found = r.parse_optional(r.normal(_option(name)))
    if found is None or found[0] is None or r.errors:
        return None
    return found[0][0]
