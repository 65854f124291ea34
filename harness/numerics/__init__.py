"""What a build computes, held to an independent reference.

The pure half of the numerics suite (``suites/test_numerics.py``): which generated
positions the server reports probabilities for (``reported``), the token bytes that rule
reads (``token_bytes``), the per-position figures between the server's distribution and
the reference's (``divergence``), and the thresholds they are held to, with the
measurements behind them (``thresholds``). The reference forward pass itself is
``harness.reference``, which shares no code with llama.cpp.
"""
