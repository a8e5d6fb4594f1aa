"""Read YAML as nodes that remember their line, so every complaint can say ``file:line``.

PyYAML's composer already tracks positions (``node.start_mark``); these helpers turn nodes into
Python values one level at a time and raise ``BadInput`` pointing at the offending node.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from dspark_ci.errors import BadInput

_SCALAR_TYPE_NAMES = {
    "tag:yaml.org,2002:str": "a string", "tag:yaml.org,2002:int": "an integer",
    "tag:yaml.org,2002:float": "a number", "tag:yaml.org,2002:bool": "true/false",
    "tag:yaml.org,2002:null": "null",
}


def compose_file(path: Path) -> yaml.Node | None:
    """The document's root node (None for an empty file); syntax errors become ``file:line``."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BadInput(str(path), "no such file", "check the --baseline path") from None
    except (OSError, UnicodeDecodeError) as err:
        raise BadInput(str(path), f"cannot read it ({err})", "check the file's permissions and contents") from None
    try:
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise BadInput(where, f"not valid YAML ({err.problem or err.context})", "fix the YAML syntax") from None
    except yaml.YAMLError as err:
        raise BadInput(str(path), f"not valid YAML ({err})", "fix the YAML syntax") from None


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
    items, seen = [], {}
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
    return yaml.SafeLoader("").construct_object(node)
