"""Prefill/decode disaggregated cells as a composite of the launchers: one ``LaunchPlan`` per role instance, each
started by the selected launcher's own ``launch()``, SGLang's router in front (``plan.py``, ``group.py``,
``router.py``)."""
