"""The no-regression suites that ``harness run`` runs against the build under test.

A package, so that a wheel ships them and their node ids read
``harness/suites/test_<suite>.py::<test>`` relative to the directory holding the
``harness`` package — a checkout's root or site-packages alike.
"""
