"""CI: the GitHub Actions workflows and ChatOps (docs/CI.md).

ChatOps, one stage per module: ``commands`` (first comment line, allow-list, bounds) -> ``permissions``
-> ``resolve`` (specs -> files under test/registered, one symlink-refusing walk, runner via ``registry``'s
bounded static reading of register_*_ci calls) -> ``reply`` (comment text, status lines) -> ``chatops``
(decides; ``execute`` carries a plan out through ``github``, the one retrying client). ``event`` reads
GitHub's issue_comment payload; ``text`` echoes untrusted words harmlessly.

Workflows: ``workflow_model`` (validated records -> YAML), ``workflows`` (the definitions;
``python -m ci.workflows`` writes .github/workflows), and the helpers they call:
``matrix_outputs``, ``shards`` (nightly schedule), ``shard_run`` (a shard's cells, infra retries),
``merge_runs``, ``run_tests`` (a rerun's argv lists), ``rerun_status`` (verified reply updates).
"""
