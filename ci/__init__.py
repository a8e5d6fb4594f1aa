"""CI: the GitHub Actions workflows, the nightly's helpers and ChatOps (docs/CI.md), one package per product.

- ``dspark_ci.ci.chatops``: a PR comment -> a reply and dispatches (``dspark-ci chatops``), and the scripts the
  dispatched rerun runs (``run_tests``, ``rerun_status``).
- ``dspark_ci.ci.nightly``: the nightly's helpers (``shards``, ``shard_run``, ``merge_runs``, ``matrix_outputs``).
- ``dspark_ci.ci.workflows``: the workflows as records; ``python -m dspark_ci.ci.workflows`` writes .github/workflows.

``dspark_ci.ci.tool`` is the ``main`` wrapper every ``python -m ci.<package>.<tool>`` shares.
"""
