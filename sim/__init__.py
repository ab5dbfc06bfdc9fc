"""Lifecycle simulator, load tests and benchmarks of ASO."""
