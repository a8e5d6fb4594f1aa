"""The local launcher: every rank as a process on this machine (``lifecycle``)."""
