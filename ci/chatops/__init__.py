"""ChatOps, one stage per module: ``commands`` (first comment line, allow-list, bounds) -> ``permissions``
-> ``resolve_test_paths`` (specs -> files under test/registered, one symlink-refusing walk, runner via
``sglang_registrations``' bounded static reading of SGLang's register_*_ci calls) -> ``reply`` (comment text,
status lines) -> ``handle`` (decides; ``execute`` carries a plan out through ``github``, the one retrying
client). ``event`` reads GitHub's issue_comment payload; ``text`` echoes untrusted words harmlessly.

Run by the dispatched rerun workflow: ``run_tests`` (a rerun's argv lists), ``rerun_status`` (verified
reply updates).
"""
