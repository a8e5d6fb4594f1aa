"""CI: the GitHub Actions workflows, the nightly's helpers and ChatOps (docs/CI.md), one package per product.

- ``ci.chatops``: a PR comment -> a reply and dispatches (``dspark-ci chatops``), and the scripts the
  dispatched rerun runs (``run_tests``, ``rerun_status``).
- ``ci.nightly``: the nightly's helpers (``shards``, ``shard_run``, ``merge_runs``, ``matrix_outputs``).
- ``ci.workflows``: the workflows as records; ``python -m ci.workflows`` writes .github/workflows.

``ci.tool`` is the ``main`` wrapper every ``python -m ci.<package>.<tool>`` shares.
"""
