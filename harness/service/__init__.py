"""The results service: receives run bundles over HTTP, stores them, serves reports.

``bundle`` is the upload format, ``app`` the ASGI application, ``cli`` the ``harness
serve`` and ``harness upload`` commands.
"""
