"""The one notion of a secret: which names hold one, and how a value, an env, a command line, a report, a script,
a unit or free text is shown with it hidden. Serve scripts and units are read with the one shell lexer
(knob_shell: its callers import ``shell_statements``, ``shell_spans`` and ``script_env_argv`` from there).

Split out of knob_live because the probe runs it on every host on every ``drift``: this file imports only
knob_lean and knob_shell at module level, so a probe process pays for no ``re``, ``enum``, ``typing``,
``functools``, ``json`` or ``hashlib`` (about 20 ms of host CPU per probe, docs/PERFORMANCE.md). Standard library
only; what the controller alone needs (``redact_text``'s patterns, ``fnmatch`` for listed globs) is imported where
it is used. The controller imports this file as ``knobfleet.module_utils.knob_redact``, the roles' modules as
``ansible.module_utils.knob_redact``.
"""

from __future__ import annotations

from .knob_lean import hmac_sha256
from .knob_shell import shell_spans

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only (never evaluated here: ``from __future__ import annotations``)
    from typing import Any


# --- secrets --------------------------------------------------------------------------------------------------
#
# One notion of a secret, used on the hosts (probe, install, verify) and on the controller (render, plan, apply,
# drift, history): a value is secret when the name it is given under is — an env var, a launch flag (``api-key``),
# a key of an engine's report (``api_key``) — or when it came from vault or knob_serve_secret_env (the controller
# adds those names to the list every caller passes as ``secret``). Names compare in one spelling: upper case,
# ``-`` and ``.`` as ``_``, camelCase split (``--api-key``, ``API_KEY``, ``apiKey`` are one name).
#
# A secret's value is replaced as a whole, before any text, diff or report is made of it, by a marker: with the
# fleet's key (the controller's, handed to the host with each call) ``<secret hmac:…>``, a keyed hash that equal
# values share (so a rotation shows, and the rule compares markers) and that nobody without the key can test a
# guess against; without a key, ``<secret>`` (show less: nothing to test a guess against either).

# Anywhere in the name, inside a word too (AWS_SECRET_ACCESS_KEY, DBPASSWORD).
SECRET_PARTS = ("SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "CREDENTIAL")
# Whole words anywhere in the name (TOKEN, not TOKENS or TOKENIZER: max-total-tokens is a size).
SECRET_WORDS = (("TOKEN",), ("API", "KEY"), ("APIKEY",), ("PRIVATE", "KEY"), ("AUTH", "KEY"), ("PASS",))
MARKER_PREFIX = "<secret"
_GLOB = "*?["


_LOWER = frozenset("abcdefghijklmnopqrstuvwxyz")
_UPPER = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZ")


class _Blank(dict):  # type: ignore[type-arg]
    """``str.translate`` table: the characters a name's words are made of map to themselves, any other to a blank."""

    def __missing__(self, code: int) -> str:
        return " "


_WORD_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789*?[]!"
_WORD_TABLE = _Blank({ord(c): c for c in _WORD_CHARS})
_ASCII_TABLE = {i: chr(i) if chr(i) in _WORD_CHARS else " " for i in range(128)}  # no Python call per character


def _words(name: str) -> list[str]:
    """A name's words in upper case: ``_`` before each ASCII capital that follows an ASCII lower-case letter
    (camelCase), upper-cased, split at every run of characters other than ASCII letters, digits and the glob
    characters ``*?[]!``. Without ``re``: the same words as ``re.sub("([a-z])([A-Z])", ...)`` then
    ``re.split("[^A-Za-z0-9*?\\[\\]!]+", ...)`` (a property test holds the two equal)."""
    ascii_ = name.isascii()
    if (not ascii_ or not (name.islower() or name.isupper())) and any(c in _LOWER for c in name):
        out, prev = [], ""
        for c in name:
            if c in _UPPER and prev in _LOWER:
                out.append("_")
            out.append(c)
            prev = c
        name = "".join(out)
    return name.upper().translate(_ASCII_TABLE if ascii_ else _WORD_TABLE).split()


def secret_name(name: str) -> str:
    """The one spelling names are compared in: ``--api-key``, ``api_key``, ``apiKey`` are ``API_KEY``."""
    return "_".join(_words(str(name).lstrip("-")))


def _by_default(words: list[str]) -> bool:
    joined = "_".join(words)
    if any(part in joined for part in SECRET_PARTS):
        return True
    if "TOKEN" not in joined and "KEY" not in joined and "PASS" not in joined:  # every sequence below has one
        return False
    for seq in SECRET_WORDS:
        for k in range(len(words) - len(seq) + 1):
            if tuple(words[k : k + len(seq)]) == seq:
                return True
    return False


def is_secret(name: str, secret: Any = ()) -> bool:
    """Whether a value given under ``name`` (env var, flag, report key) is secret. ``secret``: names or fnmatch
    patterns marked secret (the catalog's ``secret: true`` knobs, knob_serve_secret_env, vault-sourced host
    vars); an entry ``!NAME`` marks a name that matches knobfleet's patterns but is not one (the catalog's
    ``secret: false``: SGLANG_INIT_NEW_TOKEN_RATIO is a ratio). A name listed secret stays secret."""
    return _is_secret(str(name), _entries_of(secret))


def _entries_of(secret: Any) -> tuple[str, ...]:
    """``secret`` as the hashable tuple of strings the cached checks take (no copy when it already is one: a probe
    asks hundreds of times with the same list)."""
    if secret is _CHECKED[0]:
        return secret  # type: ignore[no-any-return]
    if type(secret) is tuple and all(type(e) is str for e in secret):
        _CHECKED[0] = secret  # a tuple of str stays one: checked once, not at each of the probe's ~550 names
        return secret
    return tuple(str(e) for e in (secret or ()))


_CHECKED: list[Any] = [None]


_ENTRIES: dict[tuple[str, ...], tuple[frozenset[str], tuple[Any, ...], frozenset[str], tuple[Any, ...]]] = {}
_SECRET: dict[tuple[str, tuple[str, ...]], bool] = {}


def _entries(extra: tuple[str, ...]) -> tuple[frozenset[str], tuple[Any, ...], frozenset[str], tuple[Any, ...]]:
    """``extra`` read once (a probe asks about hundreds of names against the same list): the names marked secret,
    the compiled patterns marked secret, and the same two for the ``!`` entries, in ``secret_name`` spelling.
    ``fnmatch`` and ``re`` are imported only for a list that holds a glob."""
    got = _ENTRIES.get(extra)
    if got is not None:
        return got
    plain: tuple[set[str], set[str]] = (set(), set())
    globs: tuple[list[Any], list[Any]] = ([], [])
    for entry in extra:
        neg = entry.startswith("!")
        body = entry[1:] if neg else entry
        pattern = secret_name(body)
        if any(c in body for c in _GLOB):
            import fnmatch
            import re

            globs[neg].append(re.compile(fnmatch.translate(pattern)).match)  # what fnmatchcase runs
        else:
            plain[neg].add(pattern)
    got = frozenset(plain[0]), tuple(globs[0]), frozenset(plain[1]), tuple(globs[1])
    if len(_ENTRIES) >= 64:
        _ENTRIES.clear()
    _ENTRIES[extra] = got
    return got


def _is_secret(name: str, extra: tuple[str, ...]) -> bool:
    got = _SECRET.get((name, extra))
    if got is None:
        got = _decide(name, extra)
        if len(_SECRET) >= 8192:
            _SECRET.clear()
        _SECRET[(name, extra)] = got
    return got


def _decide(name: str, extra: tuple[str, ...]) -> bool:
    norm = secret_name(name)
    if not norm:
        return False
    listed, listed_globs, unlisted, unlisted_globs = _entries(extra)
    if norm in listed or any(m(norm) for m in listed_globs):
        return True
    if norm in unlisted or any(m(norm) for m in unlisted_globs):
        return False
    return _by_default(norm.split("_"))


def is_secret_flag(name: str, secret: Any = ()) -> bool:
    """A launch flag whose value is secret, also when abbreviated as argparse allows (``--api-k`` for
    ``--api-key``, a prefix of a flag the list names)."""
    if is_secret(name, secret):
        return True
    flag = str(name).replace("_", "-").lower()
    if len(flag) < 3:
        return False
    listed = [str(e) for e in (secret or ()) if not str(e).startswith("!") and not any(c in str(e) for c in _GLOB)]
    for entry in listed:
        full = entry.lower().replace("_", "-")
        # --api-k is --api-key; --ssl-keyfile (a whole word of --ssl-keyfile-password) is a flag of its own
        if full.startswith(flag) and full != flag and full[len(flag)] != "-" and flag[-1] != "-":
            return True
    return False


def redact_value(value: Any, key: str = "") -> str:
    """What a secret's value becomes wherever knobfleet shows, stores or compares it: with the fleet's ``key`` a
    keyed hash (HMAC-SHA256, 64 bits shown; equal values give equal text, so the rule still compares them),
    without one just ``<secret>``. The whole value, whatever characters it holds."""
    if not key:
        return MARKER_PREFIX + ">"
    data = str(value).encode("utf-8", "surrogateescape")
    digest = hmac_sha256(str(key).encode("utf-8", "surrogateescape"), data)
    return "%s hmac:%s>" % (MARKER_PREFIX, digest[:16])


def shown_digest(digest: Any, holds_secret: bool, key: str = "") -> Any:
    """The sha256 of a file as shown off the host: of a file that holds a secret, with the fleet's key, a keyed
    digest (``hmac:…``), because the plain digest of a script whose every other byte is printed tests a guess of
    the secret as well as an unsalted hash would. Equal digests stay equal, so the rule still compares them."""
    if not key or not holds_secret or not isinstance(digest, str) or digest.startswith("hmac:"):
        return digest
    return "hmac:" + hmac_sha256(str(key).encode("utf-8", "surrogateescape"), digest.encode())


def is_marker(value: Any) -> bool:
    return isinstance(value, str) and value.startswith(MARKER_PREFIX) and value.endswith(">")


def redact_env(env: dict[str, str], secret: Any = (), key: str = "") -> dict[str, str]:
    secret = _entries_of(secret)
    return {k: redact_value(v, key) if is_secret(k, secret) else v for k, v in env.items()}


def redact_argv(argv: list[str], secret: Any = (), key: str = "") -> list[str]:
    """A command line with the value of every secret flag replaced: ``--api-key=V`` and ``--api-key V`` (the
    word after a bare secret flag, whatever it looks like: a secret may start with ``--``, and no secret flag is
    a bare switch, so the next word can only be its value or a broken command line)."""
    out: list[str] = []
    hide_next = False
    for token in argv:
        token = str(token)
        if hide_next:
            out.append(redact_value(token, key))
            hide_next = False
            continue
        hide_next = False
        if token.startswith("--") and len(token) > 2:
            name, sep, value = token[2:].partition("=")
            if is_secret_flag(name, secret):
                if sep:
                    out.append("--%s=%s" % (name, redact_value(value, key)))
                    continue
                hide_next = True
        out.append(token)
    return out


def redact_tree(data: Any, secret: Any = (), key: str = "") -> Any:
    """An engine's JSON report (server args, env) with the values of secret keys replaced at any depth (SGLang's
    server info carries ``api_key``, vLLM's ``/server_info`` its env), and every list of strings read as a
    command line (``redact_argv``)."""
    secret = _entries_of(secret)  # once, not at every key
    if isinstance(data, dict):
        out = {}
        for k, v in data.items():
            # every value but None and booleans, "" too: redact_env hides an empty value, and the two must agree
            if v is not None and not isinstance(v, bool) and isinstance(k, str) and is_secret(k, secret):
                if isinstance(v, dict | list):
                    import json

                    v = json.dumps(v, sort_keys=True, default=str)
                out[k] = redact_value(v, key)
            else:
                out[k] = redact_tree(v, secret, key)
        return out
    if isinstance(data, list):
        if data and all(isinstance(v, str) for v in data):
            return redact_argv(data, secret, key)
        return [redact_tree(v, secret, key) for v in data]
    return data


_IDENT_START = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_")
_IDENT = _IDENT_START | frozenset("0123456789")


def _identifier(name: str) -> bool:
    """A shell variable name: ``[A-Za-z_][A-Za-z0-9_]*`` (ASCII only)."""
    return bool(name) and name[0] in _IDENT_START and all(c in _IDENT for c in name)


def _redact_words(
    text: str, statements: list[list[tuple[str, int, int]]], secret: Any, key: str, values: Any = None
) -> list[tuple[int, int, str]]:
    """(start, end, replacement) for every secret word of lexed shell text: an assignment ``NAME=V`` with a
    secret name (export, a command's prefix, env, systemd's Environment=), ``--flag=V`` with a secret flag, and
    the word after a bare secret flag. ``values``: a list that collects the clear values."""
    edits = []
    found = values if values is not None else []
    for words in statements:
        hide_next = False
        for word, start, end in words:
            if hide_next:  # as in redact_argv: the word after a bare secret flag is its value, whatever it looks like
                edits.append((start, end, "'%s'" % redact_value(word, key)))
                found.append(word)
                hide_next = False
                continue
            hide_next = False
            name, sep, value = word.partition("=")
            if word.startswith("--") and len(word) > 2:
                flag, fsep, fvalue = word[2:].partition("=")
                if is_secret_flag(flag, secret):
                    if fsep:
                        edits.append((start, end, "'--%s=%s'" % (flag, redact_value(fvalue, key))))
                        found.append(fvalue)
                    else:
                        hide_next = True
            elif sep and _identifier(name) and is_secret(name, secret):
                edits.append((start, end, "%s='%s'" % (name, redact_value(value, key))))
                found.append(value)
    return edits


def secret_values(text: str, secret: Any = ()) -> list[str]:
    """The clear values ``redact_script`` hides in a serve script: what a host scrubs from text it did not make
    (an engine that logs its own arguments, in the journal tail a failed start returns)."""
    values: list[str] = []
    _redact_words(text, shell_spans(text), secret, "", values)
    return values


def _apply(text: str, edits: list[tuple[int, int, str]]) -> str:
    for start, end, new in sorted(edits, reverse=True):
        text = text[:start] + new + text[end:]
    return text


def redact_script(text: str, secret: Any = (), key: str = "") -> str:
    """A serve script with every secret value replaced as a whole (``_redact_words``), read with the same lexer
    as ``script_env_argv``: a value spans whatever lines and characters it holds (a quoted newline, \\f, \\v,
    \\x1c-\\x1e, \\x85, \\u2028 included). The rest of the text is kept byte for byte, so diffs stay readable
    and reading the result back gives the env and argv with markers in place of the values."""
    return _apply(text, _redact_words(text, shell_spans(text), secret, key))


UNIT_VALUE_KEYS = ("Environment", "Exec", "SetCredential")


def redact_unit(text: str, secret: Any = (), key: str = "") -> str:
    """A systemd unit or drop-in with secret values replaced: ``Environment=`` assignments, secret flags of
    ``Exec*=`` command lines (each line lexed alone, continuation lines joined), and the whole value of
    ``SetCredential*=``. Lines are split on \\n only, as systemd reads them."""
    edits: list[tuple[int, int, str]] = []
    pos, n = 0, len(text)
    while pos < n:
        end = pos
        while True:  # a logical line: physical lines joined by a trailing backslash
            nl = text.find("\n", end)
            nl = n if nl < 0 else nl
            if nl < n and nl > pos and text[nl - 1] == "\\":
                end = nl + 1
                continue
            break
        line = text[pos:nl]
        stripped = line.lstrip()
        lead = len(line) - len(stripped)
        name, sep, _value = stripped.partition("=")
        name = name.strip()
        if sep and name.startswith(UNIT_VALUE_KEYS):
            at = pos + lead + stripped.index("=") + 1
            value = text[at:nl]
            if name.startswith("SetCredential"):
                ident, colon, cred = value.partition(":")
                if colon and cred:
                    edits.append((at + len(ident) + 1, nl, redact_value(cred, key)))
            else:
                spans = [[(w, at + s, at + e) for w, s, e in st] for st in shell_spans(value.replace(";", " "))]
                edits += _redact_words(text, spans, secret, key)
        pos = nl + 1
    return _apply(text, edits)


def redact_text(text: str, secret: Any = (), key: str = "", values: Any = ()) -> str:
    """Free text (a message, a ledger reason) with every known secret ``values`` replaced wherever it occurs, and
    ``NAME=V`` / ``--flag=V`` / ``--flag V`` of secret names replaced up to the next blank. For text made
    before redaction existed (old ledger lines); everything knobfleet writes now is redacted where it is made."""
    import json
    import re

    for v in sorted({str(v) for v in values or () if v}, key=len, reverse=True):
        for form in {v, repr(v)[1:-1], json.dumps(v)[1:-1], json.dumps(v, ensure_ascii=False)[1:-1]}:
            text = text.replace(form, redact_value(v, key))

    def hide(m: Any) -> str:
        name = m.group("name")
        flag = m.group("dash") == "--"
        if (flag and is_secret_flag(name, secret)) or (not flag and is_secret(name, secret)):
            if is_marker(m.group("value")):
                return str(m.group(0))
            return "%s%s%s%s" % (m.group("dash"), name, m.group("sep"), redact_value(m.group("value"), key))
        return str(m.group(0))

    value = r"(?P<value><secret[^>]*>|[^\s,;'\"]+)"
    text = re.sub(r"(?P<dash>--)(?P<name>[A-Za-z][A-Za-z0-9_.-]*)(?P<sep>=| )" + value, hide, text)
    return re.sub(r"(?P<dash>\b)(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?P<sep>=)" + value, hide, text)


# --- values shaped like secrets (the controller's: the names of the vars that hold them join the secret list) ---

# The URL shape up to its password. The run to the line's last "@" is checked once per line (``has_url_password``),
# not from every scheme in it (that is quadratic: a 64 KiB value of "/a://b:" took over a second).
URL_START = r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*://[^/@\s:]*:"

# (what it is, pattern): credentials a value carries whatever its name (an innocent JWT_CACHE=eyJ..., a database
# URL with its password). Anchored on what such values always have, so a path, a host:port or a model name never is.
SHAPES = (
    # the password runs to the last @ of the line, as telemetry.prom.redacted reads userinfo: one typed with a /,
    # a space, ? or # (which end a URL's host part early) is a password too (issue 56)
    # (a scheme starts after a character no scheme holds: without the lookbehind a 100 KB word of letters is tried
    # from every one of its positions, 8 s of regex for one error line)
    ("a URL with a password in it", URL_START + r"[^@\r\n]+@"),
    ("a JSON Web Token", r"(?<![A-Za-z0-9_-])eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{8,}"),
    ("a GitHub token", r"\bgh[pousr]_[A-Za-z0-9]{30,}"),
    ("a GitLab token", r"\bglpat-[A-Za-z0-9_-]{20,}"),
    ("a Hugging Face token", r"\bhf_[A-Za-z0-9]{30,}"),
    ("a Slack token", r"\bxox[abposr]-[A-Za-z0-9-]{10,}"),
    ("an API key (sk-…)", r"\bsk-(?:proj-|ant-)?[A-Za-z0-9_-]{20,}"),
    ("an AWS access key", r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),
    ("a private key", r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
)


URL_SHAPE = SHAPES[0][0]


def has_url_password(text: str) -> bool:
    """Whether ``text`` holds what ``SHAPES``' URL shape matches (a scheme, a user, ``:``, a password of one or more
    characters, ``@``, on one line), in time linear in the text."""
    import re

    start = re.compile(URL_START)
    for line in re.split(r"[\r\n]", text):
        last = line.rfind("@")
        pos = 0
        while last > 0:
            m = start.search(line, pos, last)
            if m is None:
                break
            if line[m.end()] != "@":  # a password of one character or more before the next "@"
                return True
            pos = m.start() + 1
    return False


def secret_shape(value: object) -> str | None:
    """What secret ``value`` looks like (one of ``SHAPES``), or None. Only strings are looked at, the first 64 KiB."""
    if not isinstance(value, str) or len(value) < 8:
        return None
    import re

    text = value[: 64 * 1024]
    for what, pattern in SHAPES:
        if has_url_password(text) if what == URL_SHAPE else re.search(pattern, text):
            return what
    return None
