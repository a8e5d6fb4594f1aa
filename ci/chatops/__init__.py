"""ChatOps, one stage per module: ``commands`` (first comment line, allow-list, bounds) -> ``permissions``
-> ``resolve_test_paths`` (specs -> files under test/registered, one symlink-refusing walk, runner via
``sglang_registrations``' bounded static reading of SGLang's register_*_ci calls) -> ``fleet`` (is that runner
label one of ours) -> ``reply`` (comment text,
status lines) -> ``handle`` (decides; ``execute`` carries a plan out through ``github``, the one client,
whose every write is done at most once). ``decision`` hands a decision from the workflow's read-only job
(which has the PR's tree) to its writing job (which never sees it). ``event`` reads GitHub's issue_comment
payload as untrusted bytes; ``text`` makes untrusted words inert in a reply.

Run by the dispatched workflows: ``duplicate_run`` (is this run a repeated dispatch of the same command),
``run_tests`` (a rerun's argv lists), ``rerun_status`` (verified reply updates).
"""
