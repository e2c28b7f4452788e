"""asv benchmarks for walsvc: one module per idea, each target of issue 2 measured
against a baseline run side by side in the same process (see README.md)."""
