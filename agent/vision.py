"""The model sees the charts its code made: the figures a cell showed go into the conversation
as image parts (OpenAI `image_url` data URLs, PNG, downscaled), in a user message right after
the observation (a tool message cannot hold images in the OpenAI chat API; text ReAct the same).

`--vision auto|on|off` [env SANDCELL_VISION]: `on` always sends them, `off` never, `auto` sends
them until the endpoint refuses a request for its images (agent.model.openai_model raises ImagesUnsupported);
the loop then sends it again without them, once, and sends none for the rest of the session.

The figures are decoded on the host with Pillow, from bytes model code chose: only PNG and JPEG,
only up to MAX_PIXELS (larger ones are named, not decoded), and the bytes were capped already by
the sandbox's rich-output limits (--max-rich-mb)."""

from __future__ import annotations

import base64
import binascii
import io

from sandcell.sandbox.execution import Execution
from sandcell.sandbox.render import IMAGE_TYPES

MODES = ("auto", "on", "off")
VISION_ENV = "SANDCELL_VISION"
MAX_IMAGES = 3  # per observation; the others are named
MAX_SIDE = 768  # pixels of the longer side once downscaled (OpenAI's "high" detail tiles 512)
MAX_PIXELS = 40_000_000  # larger figures are not decoded on the host (a decompression bomb)
# What one image costs in the context budget: about what OpenAI bills a 768 px image at high
# detail (85 + 170 per 512 px tile, 4 tiles); the budget counts characters, about 4 a token.
IMAGE_TOKENS = 800
IMAGE_CHARS = IMAGE_TOKENS * 4
_DECODED = {"image/png": "PNG", "image/jpeg": "JPEG"}

# What endpoints say when a model takes no image input (lower case, matched in the error text):
REFUSALS = (
    "image_url is only supported by certain models",  # OpenAI: a model without vision
    "is not a multimodal model",  # vLLM serving a text-only model (HTTP 400)
    "missing data required for image input",  # Ollama: a model without a projector (HTTP 500)
    "image input is not supported",  # llama.cpp's llama-server without --mmproj (HTTP 500)
    # llama-cpp-python's server, with a chat format that has no vision handler, puts the parts
    # into the prompt as text (the whole data URL): one chart then overflows the context (400
    # context_length_exceeded; measured with SmolLM2, a 200x150 PNG asked for 97243 tokens)
    "context_length_exceeded",
    'can only concatenate str (not "list")',  # older llama-cpp-python: no list content at all
    "does not support image",
    "doesn't support image",
    "images are not supported",
    "image input not supported",
)


def refused(error_text: str) -> bool:
    """Does an endpoint's error (for a request that carried images) say it takes none?"""
    said = error_text.lower()
    return any(r in said for r in REFUSALS)


def figures_message(executions: list[Execution]) -> dict | None:
    """A user message with the figures these cells showed (at most MAX_IMAGES, downscaled; the
    others, and SVGs, named), or None when they showed none the model can be sent."""
    shown: list[tuple[str, str]] = []
    named: list[str] = []
    for ex in executions:
        for result in ex.results:
            mime = next((m for m in IMAGE_TYPES if m in result.data), None)
            if mime is None:
                continue
            name = result.path or f"figure {len(shown) + len(named) + 1}"
            url = None
            if mime in _DECODED and len(shown) < MAX_IMAGES:
                url = _png_url(result.data[mime], mime)
            if url:
                shown.append((name, url))
            else:
                named.append(name)
    if not shown:
        return None
    text = "The figures the code above showed: " + ", ".join(name for name, _ in shown) + "."
    if named:
        text += f" Not shown here (see the files): {', '.join(named)}."
    parts: list[dict] = [{"type": "text", "text": text}]
    parts += [{"type": "image_url", "image_url": {"url": url}} for _, url in shown]
    return {"role": "user", "content": parts}


def _png_url(data: str, mime: str) -> str | None:
    """A data URL of the figure as a PNG no larger than MAX_SIDE, or None if it is not one
    Pillow reads within the limits (it is then named only)."""
    from PIL import Image  # only a session that shows figures to a model pays for the import

    try:
        raw = base64.b64decode(data, validate=False)
        with Image.open(io.BytesIO(raw), formats=[_DECODED[mime]]) as image:
            if image.width * image.height > MAX_PIXELS:
                return None
            image.thumbnail((MAX_SIDE, MAX_SIDE))  # keeps the aspect ratio; never enlarges
            out = io.BytesIO()
            image.convert("RGBA" if image.mode in ("RGBA", "LA", "P") else "RGB").save(
                out, "PNG", optimize=True
            )
    except (OSError, ValueError, binascii.Error, Image.DecompressionBombError):
        return None  # not an image Pillow reads (model code may display any bytes)
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode("ascii")


# -- messages that may hold image parts ---------------------------------------------------


def text_of(message: dict) -> str:
    """A message's text: its content, or the text parts of a content list."""
    content = message.get("content") or ""
    if isinstance(content, str):
        return content
    return "\n".join(p.get("text", "") for p in content if p.get("type") == "text")


def image_count(message: dict) -> int:
    content = message.get("content")
    if isinstance(content, str) or not content:
        return 0
    return sum(1 for p in content if p.get("type") == "image_url")


def drop_images(message: dict, why: str) -> int:
    """Replace a message's image parts with a note (its text stays); returns how many."""
    n = image_count(message)
    if n:
        message["content"] = text_of(message) + f" [{n} image{'s' * (n > 1)} {why}]"
    return n


def without_images(messages: list[dict], why: str) -> int:
    """Every image part of a history replaced by a note, in place; returns how many."""
    return sum(drop_images(m, why) for m in messages)
