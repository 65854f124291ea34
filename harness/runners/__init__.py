"""Starting and stopping llama-server: the server seam (``base``) and its runners.

A child process (``subprocess_runner``), a container (``container_runner``) or a server
the developer started (``external_runner``), each behind the same protocols, with the
readiness wait beside them. Nothing here imports ``harness.supervise``, which sits above.
"""
