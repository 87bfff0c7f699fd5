"""Batch work's home: a job's declared checks (checks.py), and more to come."""
