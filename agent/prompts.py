"""The words the agent says to the model: a lean system prompt and the few nudges."""

from __future__ import annotations

import datetime as dt
import os

from sandcell.agent.vision import text_of
from sandcell.sandbox.inputs import Inputs
from sandcell.sandbox.render import MAIN_PACKAGES, MEMORY_ADVICE
from sandcell.sandbox.wheelhouse import PROMPT_NAMES, Offer
from sandcell.tools.file_metadata import profile_inputs
from sandcell.tools.profile import human_size

SYSTEM = """You are sandcell, a careful data analyst. Answer questions about the user's files by \
running Python in a sandboxed Jupyter kernel ({network}; state persists). Today is {today}.
Look at the data before computing; print only what you need; save files you create under \
/workspace/output. Base the answer on what the tools showed, with numbers and units.
{inputs}{protocol}"""

FORCED_ANSWER = (
    "You have no more steps. Do not call any tool. From what you have found so far, give your "
    "best Final Answer now, and say what is uncertain or missing."
)

LENGTH_NUDGE = (
    "Your last reply was cut off by the output token limit before it was complete, so nothing "
    "was run. Reply again, shorter: one brief thought and one action (keep code short, print "
    "less), or the Final Answer."
)

UNLABELLED = " If the text above is your answer, send it again starting with `Final Answer:`."


def system_prompt(
    inputs_profile: str,
    protocol_block: str,
    today: dt.date | None = None,
    packages: str = "",
    allow_net: tuple[str, ...] = (),
) -> str:
    """Each tool says when to use it and when not in its own description (the `tools`
    definitions, or the ReAct block), so the prompt does not repeat them. `allow_net`: the
    hosts the sandbox may reach (--allow-net), named to the model; none: no network."""
    described = "\n\n".join(t.strip() for t in (inputs_profile, packages) if t.strip())
    inputs = f"\n{described}\n" if described else ""
    protocol = f"\n{protocol_block.strip()}" if protocol_block.strip() else ""
    network = (
        f"network: only HTTP(S) to {', '.join(e.removeprefix('internal:') for e in allow_net)}, "
        "through its proxy"
        if allow_net
        else "no network"
    )
    return SYSTEM.format(
        today=(today or _today()).isoformat(), inputs=inputs, protocol=protocol, network=network
    ).strip()


def _today() -> dt.date:
    """Today, or the day SANDCELL_TODAY names (YYYY-MM-DD): where a prompt must not change
    with the calendar (a small real model's tests: its replies turn on every token, the
    date's too). A value that is not a date is ignored."""
    try:
        return dt.date.fromisoformat(os.environ.get("SANDCELL_TODAY", ""))
    except ValueError:
        return dt.date.today()


def packages_note(offer: Offer, cap: int = PROMPT_NAMES) -> str:
    """What the first prompt says of packages when the operator gave a wheelhouse: the image's
    main ones, and those `%pip install` can add offline (capped), or why none can."""
    if not offer.packages and not offer.refused:
        return ""
    image = f"Installed in the sandbox: {', '.join(MAIN_PACKAGES)} and more."
    if offer.refused:
        return f"{image} No other package can be installed: {offer.refused.rstrip('.')}."
    names = ", ".join(offer.packages[:cap])
    more = f" and {len(offer.packages) - cap} more" if len(offer.packages) > cap else ""
    return (
        f"{image} These can be added offline with `%pip install NAME` (the operator's "
        f"wheelhouse; nothing else can): {names}{more}."
    )


# An input larger than this share of the sandbox's memory cannot be loaded whole by pandas
# (its frame takes several times the file's size): the first prompt says so.
BIG_SHARE = 0.5


def inputs_profile(inputs: Inputs, memory_mb: int | None = None) -> str:
    """Compact profiles of the input files, each naming the path the code sees (/data/NAME);
    the file-metadata tool answers from the same profiles. With the sandbox's memory, inputs
    too big to load whole come with advice on reading them."""
    if not inputs:
        return ""
    return profile_inputs(inputs) + big_inputs_advice(inputs, memory_mb)


def big_inputs_advice(inputs: Inputs, memory_mb: int | None) -> str:
    """What to do when an input, or all of them together, is larger than about half the
    sandbox's memory; "" otherwise."""
    if not memory_mb:
        return ""
    limit = memory_mb * 2**20 * BIG_SHARE
    sizes = {item.sandbox_path: item.size or 0 for item in inputs}
    big = [f"{path} ({human_size(size)})" for path, size in sizes.items() if size > limit]
    total = sum(sizes.values())
    if not big and total <= limit:
        return ""
    what = ", ".join(big) if big else f"the inputs together ({human_size(total)})"
    return (
        f"\n\nToo big to load whole: {what}, against {memory_mb} MB of sandbox memory (a "
        f"DataFrame takes several times its file's size). {MEMORY_ADVICE}"
    )


def nudged_for_label(messages: list[dict]) -> bool:
    """Replies with no action and no label are nudged once; prose again is taken as the answer."""
    return text_of(messages[-1]).endswith(UNLABELLED)
