"""The elastic agent: worker specs and states, the run loop, supervision, watchdog, health."""
