"""`sandcell batch JOBS.jsonl --output DIR --workers N`, or `--ray [ADDRESS]` for a Ray cluster."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from sandcell.agent import stops
from sandcell.agent.cli import exits, terminal
from sandcell.agent.cli.options import (
    agent_options,
    build_limits,
    build_model,
    build_rules,
    check_options,
    expect_option_value,
    needing_ray,
    output_option,
    ray_option,
)
from sandcell.agent.jobs.batch import (
    RESULTS,
    Batch,
    Executor,
    Job,
    JobsError,
    JobSettings,
    ThreadExecutor,
    load_jobs,
    settled,
)
from sandcell.agent.model.scripted import ScriptedModel
from sandcell.sandbox.container import preflight

if TYPE_CHECKING:
    from sandcell.agent.jobs.ray_batch import RayExecutor
    from sandcell.agent.seams import Model


@click.command("batch")
@click.argument("jobs_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@output_option("Folder for <id>/ results and results.jsonl.", required=True)
@click.option(
    "--workers",
    type=click.IntRange(1, 64),
    default=2,
    show_default=True,
    help="Sandboxes running at once.",
)
@ray_option(
    "Run the jobs on a Ray cluster (ADDRESS, else RAY_ADDRESS, else auto); its nodes "
    "declare --resources '{\"sandcell\": N}'. Needs pip install 'sandcell[ray]'."
)
@click.option(
    "--shared-paths",
    is_flag=True,
    help="With --ray: the nodes read the inputs at the same paths (a shared filesystem) "
    "instead of getting them through Ray's object store.",
)
@click.option(
    "--max-input-mb",
    type=click.IntRange(1, 1 << 20),
    default=512,
    show_default=True,
    help="With --ray: the most a job's inputs may add up to through the object store.",
)
@click.option("--no-progress", is_flag=True, help="No progress bar (logs, CI).")
@click.option(
    "--recipe",
    metavar="auto|DIR|FILE",
    help="Try recipes on each job first, with no model; the agent takes over when none passes "
    "the job's checks. auto: learn a recipe for each layout of input from its first passing "
    "agent run, kept in OUTPUT/recipes/; DIR: a library of such recipes (copied into "
    "OUTPUT/recipes/ and learnt on; DIR is not written); FILE: one recipe (`sandcell recipe`) "
    "for every job, nothing learnt. Every job needs checks.",
)
@check_options
@agent_options
@exits.reported()
def batch_cmd(
    jobs_file: Path,
    output: Path,
    workers: int,
    ray_address: str | None,
    shared_paths: bool,
    max_input_mb: int,
    no_progress: bool,
    recipe: str | None,
    expect: tuple[str, ...],
    check_retries: int,
    opts: dict[str, Any],
) -> None:
    """Run every job of JOBS_FILE (one JSON object a line: {"id", "task", "inputs"}, and
    optionally "expect": {"output/clean.csv": "schema.yaml"}, schema paths relative to
    JOBS_FILE). --expect gives the jobs without their own "expect" these checks.

    Rerunning the same command skips jobs already in DIR/results.jsonl; a job whose outputs
    failed their checks is run again."""
    opts = {**opts, "check_retries": check_retries}
    refuse_misplaced_options(ray_address, opts)
    default_expect = expect_option_value(expect)  # a bad schema: exit 2, before any job
    try:
        jobs = load_jobs(jobs_file, default_expect)
    except JobsError as error:
        raise click.UsageError(str(error)) from None
    shared: Model | None = None

    def make_model(job: Job) -> Model:
        nonlocal shared
        if job.replay:
            return ScriptedModel(job.replay)
        if shared is None:
            shared = build_model(opts)  # one client for all jobs: it is thread-safe
        return shared

    settings = JobSettings(
        build_limits(opts), build_rules(opts), opts["protocol"], vision=opts["vision"]
    )
    if recipe is not None:
        settings = recipe_settings(recipe, jobs, settings, output)
    if not any(job.replay for job in jobs):
        make_model(jobs[0])  # a bad endpoint or key fails now (exit 4), not once per job
    executor: Executor
    if ray_address is not None:
        executor = ray_executor(settings, ray_address, shared_paths, max_input_mb, opts)
    else:
        # so does a missing engine, image or runtime (exit 3)
        preflight(runtime=settings.limits.runtime)
        executor = ThreadExecutor(workers, settings, make_model)
    batch = Batch(jobs, output, executor, progress=not no_progress, runtime=settings.limits.runtime)
    records = batch.run()
    say_how_it_went(batch, records, output)
    failed = [r for r in records if r["status"] == "failed"]
    unanswered = [r for r in records if r["status"] == "stopped"]
    sys.exit(batch_status(failed + unanswered))


def refuse_misplaced_options(ray_address: str | None, opts: dict[str, Any]) -> None:
    """Options that go with --ray only, or without it only, and --replay (one script cannot
    serve every job): usage errors before anything starts."""
    explicit = click.get_current_context().get_parameter_source
    if ray_address is None:
        for name, flag in (("shared_paths", "--shared-paths"), ("max_input_mb", "--max-input-mb")):
            if explicit(name) == click.core.ParameterSource.COMMANDLINE:
                raise click.UsageError(f"{flag} goes with --ray (a batch on a Ray cluster)")
    elif explicit("workers") == click.core.ParameterSource.COMMANDLINE:
        raise click.UsageError(
            "--workers is for a batch on this host; with --ray each node runs as many jobs at "
            "once as its `sandcell` resource says"
        )
    if opts["replay"]:
        raise click.UsageError(
            "batch takes no --replay (one script cannot serve every job): give each job its "
            'own script with the "replay" field of its line, e.g. {"id": "q1", "task": "...", '
            '"replay": "q1.json"}'
        )


def say_how_it_went(batch: Batch, records: list[dict], output: Path) -> None:
    """The counts on stdout; each job that did not answer, and why, on stderr."""
    if batch.skipped:
        click.echo(f"skipped {batch.skipped} finished jobs (in {output / RESULTS} already)")
    failed = [r for r in records if r["status"] == "failed"]
    unanswered = [r for r in records if r["status"] == "stopped"]
    click.echo(
        f"{len(records)} jobs: {len(records) - len(failed) - len(unanswered)} answered, "
        f"{len(unanswered)} stopped without an answer, {len(failed)} failed; "
        f"results in {output / RESULTS}"
    )
    say_what_recipes_did(records)
    for record in unanswered:
        why = record.get("error") or record.get("detail")
        reason = record["stop_reason"] + (f" ({why})" if why else "")
        if record["stop_reason"] == stops.SANDBOX_ERROR:
            reason = exits.with_doctor(reason)
        terminal.echo(f"  {record['id']}: stopped: {reason}", err=True)
    for record in failed:
        terminal.echo(f"  {record['id']}: failed: {record['error']}", err=True)
    retried = [r for r in records if not settled(r)]
    if retried:
        click.echo(f"rerun the same command to retry the {len(retried)} unfinished jobs", err=True)


def say_what_recipes_did(records: list[dict]) -> None:
    """With recipes: how many jobs each way was answered, the recipes learnt, and each layout
    that drifted (a new recipe for a known layout), said rather than hidden."""
    solved = [r.get("solved_by") for r in records if r.get("solved_by")]
    if not solved:
        return
    learnt = [r["recipe_learned"] for r in records if r.get("recipe_learned")]
    click.echo(
        f"recipes: {solved.count('recipe')} jobs solved by a recipe, {solved.count('agent')} "
        f"by the agent; {len(learnt)} recipes learnt"
        + (f" ({', '.join(learnt)})" if learnt else "")
    )
    for record in records:
        if record.get("drift"):
            terminal.echo(f"  {record['drift']}")


def recipe_settings(
    recipe: str, jobs: list[Job], settings: JobSettings, output: Path
) -> JobSettings:
    """--recipe auto|DIR|FILE: every job needs checks (nothing else would tell a wrong output);
    a library must hold only recipes, a FILE must be one. Usage errors (exit 2) before any
    job starts. auto and DIR learn into OUT/recipes/ (a copy of DIR's first), on this host
    or, with --ray, on the driver for the whole cluster."""
    from sandcell.agent.jobs.recipe_library import Library, start_library
    from sandcell.agent.jobs.recipe_maker import RecipeError

    unchecked = [job.id for job in jobs if not job.expect]
    if unchecked:
        raise click.UsageError(
            f"--recipe needs checks on every job, and job {unchecked[0]!r} has none: give it "
            '"expect" in the jobs file, or --expect OUT=SCHEMA for all'
        )
    given = None if recipe == "auto" else Path(recipe)
    if given is not None and not given.exists():
        raise click.UsageError(f"--recipe {recipe}: no such recipe file or library folder")
    try:
        if given is not None and given.is_file():
            library = Library.single(given.resolve())
        else:
            library = start_library(given, output)
    except RecipeError as error:
        raise click.UsageError(f"--recipe: {error}") from None
    return replace(settings, recipes=library)


def ray_executor(
    settings: JobSettings,
    address: str,
    shared_paths: bool,
    max_input_mb: int,
    opts: dict[str, Any],
) -> RayExecutor:
    """The jobs on a Ray cluster: the nodes check Docker and the image themselves."""
    with needing_ray():
        from sandcell.agent.jobs.ray_batch import RayExecutor, Settings
    model = opts["model"]  # the key travels on its own, as an object in the cluster
    return RayExecutor(
        Settings(settings, replace(model, api_key=None), shared_paths),
        api_key=model.api_key,
        address=address or None,
        max_input_mb=max_input_mb,
    )


def batch_status(unfinished: list[dict]) -> int:
    """0 when every job answered; 4 (or 3) when every job that did not stopped because the
    model endpoint (or the sandbox) failed, as `run` exits; else 1."""
    reasons = {r.get("stop_reason") for r in unfinished}
    if not unfinished:
        return exits.OK
    if reasons == {stops.MODEL_ERROR}:
        return exits.MODEL
    if reasons == {stops.SANDBOX_ERROR}:
        return exits.UNAVAILABLE
    return exits.STOPPED
