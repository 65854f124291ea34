"""The per-GPU card configs, their schema and the fork KV types: data, not code.

This file makes the folder the package ``harness.configs_gpu`` in the wheel and in an
editable install, so ``importlib.resources`` finds it from either (harness/resources).
"""
