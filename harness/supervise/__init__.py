"""Supervised launches: starting a plan through any runner and retrying a failed start
the safe way (``supervisor``), and an out-of-memory start on demand (``oom_injector``)."""
