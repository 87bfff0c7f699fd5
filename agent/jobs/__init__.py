"""Batch work on jobs: declared checks on a job's outputs (checks), what its folder holds
beyond its answer (audit), the batch report (report), and recipes (recipes)."""
