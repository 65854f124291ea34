"""The Dockerfiles, GPU-runner workflows and their scripts: data, not code.

This file makes the folder the package ``harness.ci`` in the wheel and in an editable
install, so ``importlib.resources`` finds the Dockerfiles from either (harness/resources).
"""
