"""Benchmarks of perdure's hot path; each prints JSON figures and asserts nothing on speed."""
