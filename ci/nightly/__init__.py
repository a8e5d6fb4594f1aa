"""The nightly workflow's helpers: ``matrix_outputs`` (plan -> job outputs), ``shards`` (cells packed onto
runners, ``fleet.json``), ``shard_run`` (a shard's cells, infra retries), ``merge_runs`` (one report)."""
