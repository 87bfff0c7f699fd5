"""Batch work on jobs: what a job's folder holds beyond its answer (audit), and the report."""
