"""The strategies the multi-host test trains (``worker.STRATEGIES`` builds them), without importing a framework."""
#: Every strategy by the name the worker takes; deterministic schedules first.
NAMES = ("sync", "localsgd", "wagma_groups", "wagma", "esync", "elasticbsp", "dssp", "adsp")
#: Schedules that do not depend on time: their final parameters equal the one-host run's, bit for bit.
DETERMINISTIC = ("sync", "localsgd", "wagma_groups")
