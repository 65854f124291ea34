"""``harness repro``: run one recorded failure again, on the exact build, here.

``failure`` reads a recorded result (a file, or the results service through ``fetch``,
addressed as ``target`` parses it); ``build`` finds or rebuilds the build it ran;
``command`` maps its server command lines onto this machine; ``rerun`` runs the test
again and reads its outcome; ``properties`` is what a run records for all of this.
"""
