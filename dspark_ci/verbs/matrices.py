"""``dspark-ci matrices``: the shipped matrices, each with its file; any of them runs by name
(``dspark-ci run smoke``)."""

from __future__ import annotations

import argparse

from dspark_ci.matrices.shipped import shipped


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace) -> int:
    for name, path in shipped().items():
        print(f"{name}\t{path}")
    return 0
