"""The file-timer watchdog: torch's FileTimerClient protocol served over a FIFO.

Owns the timer table (``timer_table.py``, pure: which timers are armed and due at ``now``) and
the server (``server.py``: the FIFO, its reader thread, the kills). May import the top-level
``timer_wire`` and ``errors``, nothing else of elastic-run.
"""
