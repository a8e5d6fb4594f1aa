"""``dspark-ci sim [SGLang launch_server flags]``: the simulated SGLang server.

``dspark_ci.cli`` hands SGLang's raw argv straight to ``main`` (its flags are SGLang's, not ours);
``add_arguments``/``run`` exist so the verb shows up in ``dspark-ci --help`` like any other.
"""

from __future__ import annotations

import argparse


def main(argv: list[str]) -> int:
    from dspark_ci.sglang_sim.main import main as sim_main  # aiohttp etc. only when the simulator really runs

    return sim_main(argv)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sglang_args", nargs=argparse.REMAINDER,
                        help="flags exactly as for python3 -m sglang.launch_server (e.g. --model-path M --port P)")


def run(args: argparse.Namespace) -> int:
    return main(list(args.sglang_args))
