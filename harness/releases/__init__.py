"""``harness releases``: the suites over a span of published llama.cpp releases.

``published`` (pure) names releases and picks a span; ``release_source`` gets a
release's source; ``suite_run`` runs the suites against a release's build, bounded;
``matrix`` (pure) turns a release's run record into the table's row.
"""
