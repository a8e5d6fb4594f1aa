"""A simulated SGLang server of the release in ground/sglang/release.py: SGLang's flags, admission rules and HTTP API,
no GPU.

Run it as ``python -m dspark_ci.sglang_sim [launch_server flags]`` or ``dspark-ci sim ...``; what it does
beyond SGLang (latency, acceptance, accuracy, faults) comes from ``DSPARK_SIM_*`` variables
(``dspark_ci.sglang_sim.sim_config``).
"""
