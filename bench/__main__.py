"""`python -m bench [--smoke]`: run every benchmark, write bench/results.json and
bench/REPORT.md. Figures are medians and ratios measured in the same run; nothing here
asserts a timing (these machines are shared and noisy)."""

import argparse
import json
import os
import platform
import sys
import time
from importlib.metadata import version
from pathlib import Path

import docker

from bench import ratio_table, sandbox_bench

HERE = Path(__file__).parent


def machine() -> dict:
    info = docker.from_env().info()
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": info.get("NCPU"),
        "memory_gb": round(info.get("MemTotal", 0) / 2**30, 1),
        "docker": info.get("ServerVersion"),
        "sandcell": version("sandcell"),
        "jupyter_client": version("jupyter_client"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="few repetitions: checks it works")
    parser.add_argument("--out", type=Path, default=HERE, help="folder for results.json, REPORT.md")
    args = parser.parse_args()
    started = time.time()
    results = {"machine": machine(), "smoke": args.smoke, "sandbox": sandbox_bench.run(args.smoke)}
    for name, module in ratio_table.sections():
        results[name] = module.run(args.smoke)
    results["seconds"] = round(time.time() - started, 1)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    text = ratio_table.markdown(results)
    (args.out / "REPORT.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
    # Leave without the interpreter's teardown. Once in CI a finished smoke run (its report
    # printed) was still alive 20 minutes later: this process joins and leaves two Ray
    # clusters, whose driver threads stay after ray.shutdown (gRPC, event engines), and
    # everything the run needed is closed and written by now.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
