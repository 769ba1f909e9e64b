"""Safe YAML loading with limits: duplicate keys are errors, size and alias use are bounded.

PyYAML's ``safe_load`` already refuses arbitrary objects; on top of that we refuse duplicate keys
(the last one silently winning is how a knob "doesn't take"), files over ``MAX_BYTES`` and more than
``MAX_ALIASES`` aliases (a billion-laughs document fails before it is expanded by anything).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

MAX_BYTES = 256 * 1024
MAX_ALIASES = 32


class YamlProblem(Exception):
    """A YAML problem already phrased as ``<where>: <what>; <fix>`` without the file name."""


class _LimitedLoader(yaml.SafeLoader):
    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._aliases = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                raise YamlProblem(
                    f"line {mark.line + 1}: more than {MAX_ALIASES} YAML aliases; "
                    "write the values out instead of using anchors"
                )
        return super().compose_node(parent, index)

    def construct_object(self, node: Any, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, LookupError, AttributeError, TypeError, OverflowError) as exc:
            # PyYAML's constructors fail with plain errors on values its resolver took for a number or a date
            # (0x_, 2020-13-45) or an explicit tag cannot read (!!int x): a problem with its line, not a traceback
            text = node.value if isinstance(node.value, str) else node.tag
            raise YamlProblem(
                f"line {node.start_mark.line + 1}: {text!r} cannot be read as {node.tag.rsplit(':', 1)[-1]} "
                f"({exc}); quote it ('{text}') to keep the text"
            ) from None

    def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                hash(key)
            except TypeError:  # `? [a, b]` or `? {a: 1}`: PyYAML would fail on it below, we before `in seen`
                kind = "mapping" if isinstance(key, dict) else "list"
                raise YamlProblem(f"line {line}: a {kind} as a key; keys are names") from None
            if key in seen:
                raise YamlProblem(f"line {line}: duplicate key {key!r} (first at line {seen[key]}); remove one of them")
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


# What YAML 1.2 (and every reader but PyYAML's 1.1 resolver) takes as a bool, an int or a float. A plain
# scalar PyYAML resolves otherwise (on/yes/no, 010, 0b1, 1_000, 12:30) silently changes meaning: refused.
_BOOL_12 = frozenset({"true", "True", "TRUE", "false", "False", "FALSE"})
_INT_12 = re.compile(r"[-+]?(0|[1-9][0-9]*)|0o[0-7]+|0x[0-9a-fA-F]+")
_FLOAT_12 = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?|[-+]?\.(inf|Inf|INF)|\.(nan|NaN|NAN)")


def _ambiguous(loader: yaml.SafeLoader, node: Any, value: Any, ok: bool) -> Any:
    if not ok and node.style is None:
        line = node.start_mark.line + 1
        # the YAML 1.2 spelling of the value: true/false bare (a quoted 'true' would be text again), numbers as such
        plain = str(value).lower() if isinstance(value, bool) else repr(value)
        raise YamlProblem(
            f"line {line}: {node.value!r} is read by YAML 1.1 as {value!r}; quote it ('{node.value}') to keep "
            f"the text, or write {plain}"
        )
    return value


def _bool(loader: yaml.SafeLoader, node: Any) -> Any:
    value = yaml.SafeLoader.construct_yaml_bool(loader, node)
    return _ambiguous(loader, node, value, node.value in _BOOL_12)


def _int(loader: yaml.SafeLoader, node: Any) -> Any:
    value = yaml.SafeLoader.construct_yaml_int(loader, node)
    return _ambiguous(loader, node, value, bool(_INT_12.fullmatch(node.value)))


def _float(loader: yaml.SafeLoader, node: Any) -> Any:
    value = yaml.SafeLoader.construct_yaml_float(loader, node)
    return _ambiguous(loader, node, value, bool(_FLOAT_12.fullmatch(node.value)))


_LimitedLoader.add_constructor("tag:yaml.org,2002:bool", _bool)
_LimitedLoader.add_constructor("tag:yaml.org,2002:int", _int)
_LimitedLoader.add_constructor("tag:yaml.org,2002:float", _float)


def _too_large(max_bytes: int) -> str:
    """The size refusal, naming the limit that applied (catalogs have their own, larger one)."""
    why = "profiles are small, check the path" if max_bytes == MAX_BYTES else "check the path"
    return f"file is larger than {max_bytes // 1024} KiB; {why}"


def loads(text: str, max_bytes: int = MAX_BYTES) -> Any:
    """Parse one YAML document with the limits above; raises YamlProblem."""
    if len(text.encode("utf-8", "surrogatepass")) > max_bytes:
        raise YamlProblem(_too_large(max_bytes))
    try:
        loader = _LimitedLoader(text)  # the reader refuses control characters here, before any parsing
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1
        column = exc.position - text.rfind("\n", 0, exc.position)
        raise YamlProblem(
            f"line {line}, column {column}: invalid YAML: character U+{exc.character:04X} is not allowed; remove it"
        ) from None
    try:
        return loader.get_single_data()
    except YamlProblem:
        raise
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        raise YamlProblem(f"{where}invalid YAML: {exc.problem}") from None
    except yaml.YAMLError as exc:
        raise YamlProblem(f"invalid YAML: {exc}") from None
    except RecursionError:
        raise YamlProblem("nested too deeply; profiles are flat maps of knobs") from None
    finally:
        loader.dispose()


def load_file(path: Path, max_bytes: int = MAX_BYTES) -> Any:
    """Read and parse a YAML file; raises YamlProblem for size, encoding and syntax problems."""
    from knobfleet import safefile

    try:  # non-blocking and bounded: a FIFO or /dev/zero at the path is refused, never read
        raw = safefile.read_bytes(path, max_bytes, "YAML file")
    except safefile.FileRefused as exc:
        text = str(exc)
        if text.startswith("is larger than"):
            raise YamlProblem(_too_large(max_bytes)) from None
        if "must be a regular file" in text:
            raise YamlProblem(f"{text.split(';')[0]}, not a regular file; point at a YAML file") from None
        raise YamlProblem(text.replace("cannot read (", "cannot read: ").rstrip(")")) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise YamlProblem(f"byte {exc.start}: not valid UTF-8; save the file as UTF-8") from None
    if "\x00" in text:
        raise YamlProblem("contains a NUL byte; remove it")
    return loads(text, max_bytes)
