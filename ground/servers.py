"""What serves a cell (``--server``): a fact the launchers act on and the reports state, so it stands on the floor.

The simulated SGLang server (default), real SGLang, or SGLang's own front end (HTTP server, tokenizer,
detokenizer) in front of the simulated engine (sglang_sim/frontend/, local launcher only), or SGLang's real engine
on this CPU serving a tiny Llama (sglang_sim/cpu_engine/).
"""

SERVERS = ("sim", "sglang", "sglang-frontend", "sglang-engine")
SIMULATED_SERVERS = ("sim", "sglang-frontend")  # the engine is the simulator's: DSPARK_SIM_* decide what it does
