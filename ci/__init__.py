"""CI: the GitHub Actions workflows and ChatOps (docs/CI.md).

ChatOps, one stage per module: ``commands`` (first comment line, allow-list) -> ``permissions`` ->
``resolve`` (specs -> files under test/registered, runner via ``registry``'s static reading of
register_*_ci calls) -> ``reply`` (comment text, status updates) -> ``chatops`` (decides; ``execute``
carries a plan out through ``github``). ``event`` reads GitHub's issue_comment payload.

Workflows: ``workflow_model`` (validated records -> YAML), ``workflows`` (the definitions;
``python -m ci.workflows`` writes .github/workflows), and the helpers they call:
``matrix_outputs``, ``merge_runs``, ``rerun_status``.
"""
