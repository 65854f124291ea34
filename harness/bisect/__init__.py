"""``harness bisect``: from a good and a bad commit to the first bad one (issue 25).

``search`` is the pure bisection over an ordered history, ``history`` lists and exports
commits with git, ``oracles`` judge one build, ``journal`` keeps every probe on disk so
an interrupted bisect resumes, ``bisector`` runs the loop and ``table`` renders it.
"""
