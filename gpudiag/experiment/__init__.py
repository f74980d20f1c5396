"""Before/after experiments: workloads, isolated trials, ``gd.compare`` and its statistics."""
