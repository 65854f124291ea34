"""Paired A/B performance gate: interleaved runs of two builds, judged per metric."""
