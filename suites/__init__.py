"""The no-regression suites that ``harness run`` runs against the build under test.

A package, so that the wheel carries it (as ``harness.suites``, mapped from this folder in
``pyproject.toml``) and its node ids read ``suites/test_<suite>.py::<test>`` relative to
the folder holding it: the checkout's root, or ``site-packages/harness`` in a wheel.
"""
