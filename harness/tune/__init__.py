"""``harness tune``: a card's launch settings measured against their alternatives.

``quality`` reads the KV types' quality weights, ``candidates`` plans and ranks the
alternatives (pure), ``tune_measure`` runs them with the A/B machinery, ``winner`` judges
the comparisons (pure), ``tune_table`` and ``tune_record`` print and record them,
``card_entry`` turns a winner into a card's ``tuned`` entry, and ``nightly_target`` names
what the nightly's stale-card check tunes.
"""
