"""Performance figures of a running server: what to measure, and measuring it."""
