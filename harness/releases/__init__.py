"""``harness releases``: the suites over a span of published llama.cpp releases.

``catalog`` (pure) names releases and picks a span; ``fetch`` gets a release's source;
``matrix`` (pure) turns a release's run record into the table's row; ``runner`` builds
each release and runs the suites against it.
"""
