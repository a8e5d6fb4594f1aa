"""Read a YAML file into plain dicts and lists that remember the line each key and item came from.

Every message about a matrix names ``file:line``; PyYAML's nodes carry that position, so the
constructor below copies it onto the values it builds. Bad YAML and duplicate keys (which
PyYAML would otherwise silently resolve to the last one) become ``BadInput``.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from dspark_ci.errors import BadInput


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


def load_yaml(path: str):
    """The document in ``path`` as YamlMap/YamlList/scalars. ``path`` is used as given in messages."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BadInput(path, "no such matrix file", "check the path (matrices live in matrices/*.yaml)") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as err:
        raise BadInput(path, f"cannot read the matrix file ({err.__class__.__name__})",
                       "pass a readable UTF-8 YAML file") from None
    loader = _LineLoader(text)
    loader.source = path
    try:
        return loader.get_single_data()
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        line = mark.line + 1 if mark else 1
        near = f"line {line}, column {mark.column + 1}" if mark else f"line {line}"
        if err.context_mark and err.problem_mark and err.context_mark.line != err.problem_mark.line:
            near += f" (the construct opened at line {err.context_mark.line + 1})"
        problem = " ".join(p for p in (err.context, err.problem) if p)
        raise BadInput(f"{path}:{line}", f"not valid YAML: {problem}",
                       f"fix the syntax near {near}: indentation, a missing ':', an unclosed quote or bracket") from None
    except yaml.YAMLError as err:
        raise BadInput(path, f"not valid YAML: {err}", "fix the YAML syntax") from None
    finally:
        loader.dispose()
