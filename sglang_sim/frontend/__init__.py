"""SGLang 0.5.23's own front end (HTTP server, TokenizerManager, OpenAI serving layer, DetokenizerManager) in front
of the simulated engine, which plays SGLang's scheduler behind SGLang's own IPC: ``--server sglang-frontend``.

Only ``vocab.py`` is importable without SGLang; ``launch.py`` and ``scheduler.py`` import sglang and run inside
the venv ``.ci/sglang-frontend.sh`` builds (``python -m sglang_sim.frontend ARGV`` from that venv)."""
