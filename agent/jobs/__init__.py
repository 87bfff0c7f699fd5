"""Batch work, above the agent core: the batch runner and its executors (batch: threads;
ray_batch: a Ray cluster), recipes made from a passing run (recipe_maker), kept in a library
by their inputs' layout (recipe_library, fingerprint) and run before the agent
(recipe_runner), one agent run per layout at a time (layout_learning), what a finished job's
folder holds (job_files: answer.md; audit: audit.json), and the batch report (batch_report).
Declared checks, which `Agent.run(expect=)` uses, sit below in the core (agent.output_checks)."""
