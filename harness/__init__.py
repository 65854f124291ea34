"""Regression harness for llama-server builds."""

__version__ = "0.1.0"
