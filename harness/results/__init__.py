"""Run records, the results store and the baseline comparison."""
