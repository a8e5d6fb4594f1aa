"""Read YAML so that every complaint about it can name ``file:line``.

PyYAML's nodes carry their position (``node.start_mark``); everything here keeps it:

- ``compose_file(path, words)``: the document as nodes, for readers that check a file one level at
  a time and word each problem in context (baselines); ``where``, ``describe``, ``mapping_items``
  and ``scalar`` turn nodes into values and raise ``BadInput`` at the offending node.
- ``load_yaml(path, words)``: the document as plain dicts and lists that remember the line each key
  and item came from (``YamlMap``, ``YamlList``), for readers that take a file whole (matrices, host
  inventories). Duplicate keys, which PyYAML would silently resolve to the last one, are refused.

Both read the file and report unreadable files and bad syntax the same way; ``FileWords`` holds how
each kind of file words those messages (users and tests know each wording).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

import yaml
from dspark_ci.ground.errors import BadInput


@dataclass(frozen=True)
class FileWords:
    """(problem, fix) templates for a file that cannot be read or parsed.

    Fields the templates may use: ``{error}`` (the exception's text), ``{error_type}`` (its class name),
    ``{both}`` (PyYAML's context and problem, e.g. "while parsing a flow node expected ..."),
    ``{either}`` (its problem, else its context), ``{near}`` ("line 3, column 2 (the construct opened
    at line 1)").
    """

    missing: tuple[str, str]
    unreadable: tuple[str, str]
    syntax: tuple[str, str]  # an error PyYAML could place in the file
    unplaced: tuple[str, str]  # one it could not


def config_file_words(noun: str, missing_fix: str) -> FileWords:
    """The wording for a YAML config file a person writes (a matrix, a hosts inventory)."""
    return FileWords(
        missing=(f"no such {noun}", missing_fix),
        unreadable=(f"cannot read the {noun} ({{error_type}})", "pass a readable UTF-8 YAML file"),
        syntax=("not valid YAML: {both}",
                "fix the syntax near {near}: indentation, a missing ':', an unclosed quote or bracket"),
        unplaced=("not valid YAML: {error}", "fix the YAML syntax"),
    )


# --- reading and syntax: shared by both views -----------------------------------------------------

# A matrix, baseline or inventory is written by hand: the largest shipped is 7 kB (the pure-Python reader that keeps
# line numbers takes about 1 s per 200 kB on a busy core). Past these bounds a file is
# refused before it is read or built, so a wrong path (/dev/zero, a FIFO, a log) or a YAML alias bomb costs
# milliseconds, not minutes.
MAX_FILE_BYTES = 256 * 1024
MAX_EXPANDED_NODES = 200_000  # scalars, lists and mappings, every alias counted as often as it is used
_FILE_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
               (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
# What YAML forbids in a document (PyYAML's Reader.NON_PRINTABLE): control characters other than tab and newlines.
_NOT_PRINTABLE = yaml.reader.Reader.NON_PRINTABLE
_CONTROL_NAMES = {0: "NUL", 7: "BEL", 8: "BS", 0x0B: "VT", 0x0C: "FF", 0x1B: "ESC", 0x7F: "DEL"}


def _read(path: Path | str, words: FileWords) -> str:
    """The file's text; ``path`` is named as given in messages. Only a regular file of at most MAX_FILE_BYTES,
    checked before a byte is read; UTF-8 without control characters (refused with their line and column)."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise BadInput(str(path), *words.missing) from None
    except OSError as err:
        raise BadInput(str(path), *_fill(words.unreadable, error=err, error_type=err.__class__.__name__)) from None
    kind = next((name for test, name in _FILE_KINDS if test(info.st_mode)), None)
    if kind is not None:
        raise BadInput(str(path), f"is {kind}, not a file", "pass the path of a YAML file")
    if info.st_size > MAX_FILE_BYTES:
        raise _too_large(path, info.st_size)
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except OSError as err:
        raise BadInput(str(path), *_fill(words.unreadable, error=err, error_type=err.__class__.__name__)) from None
    if len(data) > MAX_FILE_BYTES:  # it grew since the stat
        raise _too_large(path, len(data))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[:err.start].count(b"\n") + 1
        raise BadInput(f"{path}:{line}", f"not UTF-8 (byte 0x{data[err.start]:02x})",
                       "save the file as UTF-8 text") from None
    _check_printable(path, text)
    _check_digits(path, text)
    return text


# Deeper than this, a matrix is a mistake (its deepest real value is 5 levels down); PyYAML's composer recurses
# per level and Python's stack ends a few hundred levels down, with a traceback instead of a message.
MAX_NESTING = 64
MAX_DIGITS = 100  # an integer longer than this is no setting (and Python refuses to convert one of 4300)
_LONG_NUMBER = re.compile(rf"(?<![\w.])[-+]?\d{{{MAX_DIGITS + 1},}}")


def _check_digits(path: Path | str, text: str) -> None:
    found = _LONG_NUMBER.search(text)
    if found is not None:
        line = text.count("\n", 0, found.start()) + 1
        raise BadInput(f"{path}:{line}", f"a number of {len(found.group().lstrip('+-'))} digits; no setting takes "
                       f"more than {MAX_DIGITS}", "write the value you mean")


def _too_deep(path: Path | str, line: int) -> BadInput:
    return BadInput(f"{path}:{line}", f"lists and mappings nested more than {MAX_NESTING} levels deep",
                    "a matrix nests a few levels: check the brackets and the indentation here")


def _deepest_line(text: str) -> int:
    """Where a document that overflowed PyYAML's stack nests deepest (first flow bracket past MAX_NESTING, else the
    most indented line): for the message only."""
    depth = 0
    for index, char in enumerate(text):
        depth += (char in "[{") - (char in "]}")
        if depth > MAX_NESTING:
            return text.count("\n", 0, index) + 1
    lines = text.splitlines() or [""]
    return max(range(len(lines)), key=lambda i: len(lines[i]) - len(lines[i].lstrip(" -"))) + 1


def _check_depth(path: Path | str, root: yaml.Node | None) -> None:
    """Refuse nesting past MAX_NESTING (walked without recursion), at the line of the first node too deep."""
    todo = [(root, 0)] if root is not None else []
    seen: set[int] = set()
    while todo:
        node, depth = todo.pop()
        if depth > MAX_NESTING:
            raise _too_deep(path, node.start_mark.line + 1)
        if id(node) in seen:  # an alias: its depth was checked where it was defined
            continue
        seen.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            todo += [(child, depth + 1) for child in node.value]
        elif isinstance(node, yaml.MappingNode):
            todo += [(part, depth + 1) for pair in node.value for part in pair]


@contextlib.contextmanager
def _no_stack_overflow(path: Path | str, text: str):
    try:
        yield
    except RecursionError:
        raise _too_deep(path, _deepest_line(text)) from None


def read_bounded(path: Path | str, words: FileWords) -> str:
    """A YAML file's text under the same bounds as every reader here (a regular file, at most MAX_FILE_BYTES,
    printable UTF-8), for readers that parse it their own way (the --k8s-extra patches)."""
    return _read(path, words)


def _too_large(path: Path | str, size: int) -> BadInput:
    return BadInput(str(path), f"is {size / 1024:,.0f} KiB; a YAML input is at most {MAX_FILE_BYTES // 1024} KiB",
                    "check the path; a matrix is a few kB: use axes and include instead of writing every cell out")


def _check_printable(path: Path | str, text: str) -> None:
    found = _NOT_PRINTABLE.search(text)
    if found is None:
        return
    code = ord(found.group())
    line = text.count("\n", 0, found.start()) + 1
    column = found.start() - (text.rfind("\n", 0, found.start()) + 1) + 1
    name = f"U+{code:04X}" + (f" ({_CONTROL_NAMES[code]})" if code in _CONTROL_NAMES else "")
    raise BadInput(f"{path}:{line}", f"control character {name} at column {column}; YAML allows only printable text",
                   "remove it; an editor that shows invisible characters finds it")


def _check_expansion(path: Path | str, root: yaml.Node | None) -> None:
    """Refuse a document whose aliases expand past MAX_EXPANDED_NODES (a "billion laughs" bomb) or into themselves,
    before anything is built from it: the readers after this one copy and walk every expanded value."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in open_nodes:
            raise BadInput(f"{path}:{node.start_mark.line + 1}", "this alias refers to itself (a recursive anchor)",
                           "repeat the values instead of nesting the anchor inside itself")
        open_nodes.add(key)
        children: list = []
        if isinstance(node, yaml.SequenceNode):
            children = node.value
        elif isinstance(node, yaml.MappingNode):
            children = [part for pair in node.value for part in pair]
        total = 1
        for child in children:
            total += size(child)
            if total > MAX_EXPANDED_NODES:
                raise BadInput(f"{path}:{node.start_mark.line + 1}",
                               f"the aliases here expand to more than {MAX_EXPANDED_NODES:,} values",
                               "a matrix that large is a mistake or an alias bomb: write the values out, or nest "
                               "fewer aliases (*name)")
        open_nodes.discard(key)
        sizes[key] = total
        return total

    if root is not None:
        size(root)


@contextlib.contextmanager
def _yaml_errors(path: Path | str, words: FileWords):
    """PyYAML's errors as ``BadInput`` at the line it points to."""
    try:
        yield
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        if mark is None:
            raise BadInput(str(path), *_fill(words.unplaced, error=err)) from None
        near = f"line {mark.line + 1}, column {mark.column + 1}"
        if err.context_mark and err.problem_mark and err.context_mark.line != err.problem_mark.line:
            near += f" (the construct opened at line {err.context_mark.line + 1})"
        both = " ".join(part for part in (err.context, err.problem) if part)
        raise BadInput(f"{path}:{mark.line + 1}",
                       *_fill(words.syntax, both=both, either=err.problem or err.context, near=near)) from None
    except yaml.YAMLError as err:
        raise BadInput(str(path), *_fill(words.unplaced, error=err)) from None


def _fill(templates: tuple[str, str], **fields) -> tuple[str, str]:
    problem, fix = templates
    return problem.format(**fields), fix.format(**fields)


# --- nodes: checked one level at a time -------------------------------------------------------------

_SCALAR_TYPE_NAMES = {
    "tag:yaml.org,2002:str": "a string", "tag:yaml.org,2002:int": "an integer",
    "tag:yaml.org,2002:float": "a number", "tag:yaml.org,2002:bool": "true/false",
    "tag:yaml.org,2002:null": "null",
}


def compose_file(path: Path | str, words: FileWords) -> yaml.Node | None:
    """The document's root node (None for an empty file)."""
    path = Path(path)
    text = _read(path, words)
    stream = io.StringIO(text)
    stream.name = str(path)  # marks (node.start_mark.name) carry the file, so later complaints can name it
    with _yaml_errors(path, words), _no_stack_overflow(path, text):
        root = yaml.compose(stream, Loader=yaml.SafeLoader)
    _check_depth(path, root)
    _check_expansion(path, root)
    return root


def where(path: Path, node: yaml.Node) -> str:
    return f"{path}:{node.start_mark.line + 1}"


def describe(node: yaml.Node) -> str:
    """What a node is, in words ("a list", "an integer", ...) for type complaints."""
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    return _SCALAR_TYPE_NAMES.get(node.tag, node.tag)


def mapping_items(path: Path, node: yaml.Node, what: str) -> list[tuple[str, yaml.Node, yaml.Node]]:
    """``(key, key_node, value_node)`` of a mapping; rejects non-mappings, non-string and duplicate keys."""
    if not isinstance(node, yaml.MappingNode):
        raise BadInput(where(path, node), f"{what} must be a mapping, not {describe(node)}")
    items: list[tuple[str, yaml.Node, yaml.Node]] = []
    seen: dict[str, yaml.Node] = {}
    for key_node, value_node in node.value:
        key = scalar(key_node)
        if not isinstance(key, str):
            raise BadInput(where(path, key_node), f"keys of {what} must be strings, not {describe(key_node)}",
                           "quote the key")
        if key in seen:
            raise BadInput(where(path, key_node), f"{key!r} appears twice in {what} (first on line {seen[key]})",
                           "keep one of them")
        seen[key] = key_node.start_mark.line + 1
        items.append((key, key_node, value_node))
    return items


def scalar(node: yaml.Node):
    """The Python value of a scalar node (str, int, float, bool, None); other nodes give None."""
    if not isinstance(node, yaml.ScalarNode):
        return None
    try:
        return yaml.SafeLoader("").construct_object(node)
    except (yaml.YAMLError, ValueError, TypeError) as err:  # a tag it cannot build: `!foo x`, `!!int abc`, `<<`
        raise BadInput(f"{node.start_mark.name}:{node.start_mark.line + 1}",
                       f"cannot read {node.value!r} as {node.tag} ({getattr(err, 'problem', None) or err})",
                       "write a plain value without a YAML tag") from None


# --- values that remember their lines: the whole file at once ---------------------------------------

class YamlMap(dict):
    """A YAML mapping. ``line``: where it starts; ``lines[key]``: where that key is written."""

    line: int = 0

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.lines: dict = {}

    def line_of(self, key) -> int:
        return self.lines.get(key, self.line)


class YamlList(list):
    """A YAML sequence. ``line``: where it starts; ``lines[i]``: where item i is written."""

    line: int = 0

    def __init__(self, *args):
        super().__init__(*args)
        self.lines: list[int] = []

    def line_of(self, index: int) -> int:
        return self.lines[index] if index < len(self.lines) else self.line


class _LineLoader(yaml.SafeLoader):
    def construct_object(self, node, deep=False):
        # `!!int abc` raises a bare ValueError deep in PyYAML; give it the node's line like any YAML error.
        try:
            return super().construct_object(node, deep)
        except (ValueError, TypeError) as err:
            raise yaml.constructor.ConstructorError(None, None, f"cannot read {node.value!r} as {node.tag} ({err})",
                                                    node.start_mark) from None

    """SafeLoader whose mappings and sequences keep their line numbers (1-based)."""

    source = "<yaml>"  # set per file, for messages


def _construct_map(loader: _LineLoader, node: yaml.MappingNode) -> YamlMap:
    loader.flatten_mapping(node)  # YAML merge keys (<<: *defaults) work as usual
    result = YamlMap()
    result.line = node.start_mark.line + 1
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        key_line = key_node.start_mark.line + 1
        try:
            seen = key in result
        except TypeError:
            raise BadInput(f"{loader.source}:{key_line}", "a mapping key must be a plain word",
                           "write keys as `name: value`") from None
        if seen:
            raise BadInput(f"{loader.source}:{key_line}",
                           f"key {key!r} appears twice in this mapping (first at line {result.lines[key]})",
                           "keep one of them")
        result[key] = loader.construct_object(value_node, deep=True)
        result.lines[key] = key_line
    return result


def _construct_list(loader: _LineLoader, node: yaml.SequenceNode) -> YamlList:
    result = YamlList(loader.construct_object(child, deep=True) for child in node.value)
    result.line = node.start_mark.line + 1
    result.lines = [child.start_mark.line + 1 for child in node.value]
    return result


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_map)
_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_list)


def load_yaml(path: Path | str, words: FileWords):
    """The document in ``path`` as YamlMap/YamlList/scalars. ``path`` is used as given in messages."""
    text = _read(path, words)
    loader = _LineLoader(text)
    loader.source = str(path)
    try:
        with _yaml_errors(path, words), _no_stack_overflow(path, text):
            root = loader.get_single_node()
            _check_depth(path, root)
            _check_expansion(path, root)
            return None if root is None else loader.construct_document(root)
    finally:
        loader.dispose()
