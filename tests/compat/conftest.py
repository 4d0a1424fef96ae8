"""The compat tests: our public APIs called as torch documents them, against torch's own."""
