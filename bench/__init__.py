"""`make bench`: side-by-side figures, as ratios measured in one run."""

import functools
import sys
from collections.abc import Callable

Run = Callable[[bool], dict]  # a section's run(smoke): its results


def skipped_without(missing: Callable[[], str | None], said: str) -> Callable[[Run], Run]:
    """A section's run(smoke), skipped where `missing()` gives a reason: printed after `said`,
    and kept in the results ({"skipped": reason})."""

    def wrap(run: Run) -> Run:
        @functools.wraps(run)
        def checked(smoke: bool) -> dict:
            reason = missing()
            if reason:
                print(f"bench: {said}: {reason}", file=sys.stderr)
                return {"skipped": reason}
            return run(smoke)

        return checked

    return wrap
