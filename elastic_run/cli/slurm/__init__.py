"""Slurm awareness: the allocation's environment turned into launcher defaults.

Owns reading ``SLURM_*`` (``allocation.py``, from a Mapping passed in) and Slurm's hostlist
grammar (``hostlist.py``). Imports nothing else of elastic-run.
"""
