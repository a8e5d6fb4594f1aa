"""The ground floor: what every stage stands on, importing none of them (docs/ARCHITECTURE.md).

- ``errors``: the errors every stage raises and the exit code each maps to;
- ``yaml_lines``: YAML read with a file:line for every message (matrices, baselines, host inventories);
- ``run_id``: a run's id;
- ``state``: where dspark-ci keeps its own state on this machine (run index, run history);
- ``sglang``: every fact of the SGLang release under test (flag snapshot, version pin, algorithms, error lines);
- ``suites``: the registry of suites, their options and the metrics each measures;
- ``records``: what a run produces (``CellResult``, ``GateResult``, ``RunResults``, ``Status``).
"""
