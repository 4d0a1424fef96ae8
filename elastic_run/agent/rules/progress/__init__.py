"""The rules on the workers' progress beats, and the models they judge by. Pure.

The models: ``beats.py`` (a worker's beat history, its learned hang timeout, its silence, the
no-progress count), ``script_end.py`` (when a script is over, and how its exit counts),
``step_times.py`` (step times, the job's median, the straggler watch). The rules, one verdict a
module: ``hung.py`` (silent workers that are hung), ``outlived.py`` (a process that outlives its
script), ``straggler.py`` (slow ranks), ``no_progress.py`` (a crash loop).

No clock, thread, process, store or I/O here: times are monotonic nanoseconds, passed in. May
import: ``agent.rules`` (the observation and the actions), ``agent.api`` (the worker states),
``agent.loop.snapshot`` (the pictures the views show) and ``agent.progress.stack_report`` (where a
worker's stacks say it is).
"""
