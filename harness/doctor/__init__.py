"""``harness doctor``: everything a run depends on, checked on this machine.

``facts`` holds what was found (plain data), ``checks`` turns facts into table rows and
an exit verdict (pure), ``gather`` looks at this machine (the only I/O).
"""
