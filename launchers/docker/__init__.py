"""The Docker launcher: every rank as a container on one of the inventory's engines (``lifecycle``), the container
spec (``spec``) and the hosts inventory with one client per engine (``hosts``). docs/DOCKER.md."""
