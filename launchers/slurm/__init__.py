"""The Slurm launcher: every cell as one Slurm job, one task per node, submitted with ``sbatch``.

Used like every launcher (``dspark_ci.launchers.contract``)::

    launcher = SlurmLauncher(SlurmOptions(partition="gpu"), LaunchContext(run_id, run_dir, caller_env=os.environ))
    launcher.preflight(plans)                       # Slurm answers; the partition exists and can hold every cell
    with launcher.launch(plan, logs_dir) as deployment:
        ...  # deployment.base_url (rank 0's address, known once the job runs); check() raises if a task ended

One job per cell: a batch script written into the cell's log folder (kept, so a person can resubmit it),
``--nodes=N --ntasks-per-node=1``, and one ``srun --kill-on-bad-exit=1`` step whose task on each node computes
its own node rank (``$SLURM_NODEID``, expanded inside the task, never in the batch shell: SGLang's own sbatch
example gets this wrong and gives every node rank 0) and its own address, then runs the rank's argv. Per-node
logs are ``logs/<cell>/<node index>.log`` (``%n``); each task writes ``<rank>.exit`` (its exit code and the time)
when its server exits, which is how the first rank to fail is named.

Time: the queue wait has its own limit (``queue_timeout_s``, Slurm's pending reason shown meanwhile); the boot
timeout starts when the job is RUNNING. Teardown (success, failure, Ctrl-C, SIGTERM): ``scancel``, then wait
until the job has reached a final state and no process of it is left. Job names and comments carry the run id,
and the job is in the run's ledger, so ``dspark-ci cleanup`` cancels what a killed run left. docs/SLURM.md.
"""
