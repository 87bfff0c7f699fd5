"""Batch work, above the agent core: the batch runner and its executors (batch: threads;
ray_batch: a Ray cluster), recipes made from a passing run (recipe_maker) and run before the
agent (recipe_runner), what a finished job's folder holds (job_files: answer.md; audit:
audit.json), and the batch report (batch_report). Declared checks, which `Agent.run(expect=)`
uses, sit below in the core (agent.output_checks)."""
