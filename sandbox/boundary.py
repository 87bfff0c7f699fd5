"""The contract between the host and the container, written once.

Standard library only: the image build (sandbox/image_build.py) puts this file in the image next to the
supervisor, the relay, the kernel extension and the file helper, which import it as
`boundary`; the host modules import it as `sandcell.sandbox.boundary`. Paths, socket names, signals,
label and metadata keys, and every marker the two sides exchange live here, each marker with
the one function that writes it and the one that parses it.
"""

import re
import shlex
import signal
import socket
import stat
import struct

# -- paths inside the container -------------------------------------------------------------
WORKSPACE = "/workspace"  # tmpfs; kept across kernel restarts
DATA = "/data"  # the inputs, each file mounted read-only on its own
OUTPUT = f"{WORKSPACE}/output"  # what a job hands back; made by the supervisor at each start
FIGURES = f"{WORKSPACE}/figures"  # every PNG a cell displays is saved here
INTERNAL = ".sandcell"  # workspace folder for sandcell's own files; never exported or listed
LOGS = f"{WORKSPACE}/logs"  # the complete output of each cell that printed much (exported)
SCRIPTS = "/opt/sandcell"  # this file and the image's programs
PACKAGES_FILE = f"{SCRIPTS}/packages.txt"  # `pip freeze` of the image, written at build time
FILES_PROGRAM = f"{SCRIPTS}/files.py"  # file operations the host asks for by `docker exec`
# The operator's wheelhouse (sandbox/wheelhouse.py), mounted read-only when it fits the image;
# `%pip install` takes packages from its index only, into PACKAGES_DIR on the /tmp tmpfs (its
# size limit holds them; a renewal empties it), a folder on the kernel's path alone.
WHEELHOUSE = "/opt/wheelhouse"
WHEELHOUSE_INDEX = f"{WHEELHOUSE}/simple"
PACKAGES_DIR = "/tmp/.sandcell-packages"
# pip install options that take a value: the word after one is not a requirement
PIP_VALUE_OPTIONS = {
    "-r", "--requirement", "-c", "--constraint", "-e", "--editable", "-i", "--index-url",
    "--extra-index-url", "-f", "--find-links", "-t", "--target", "--prefix", "--root",
    "--upgrade-strategy", "--progress-bar", "--python-version", "--platform",
    "--implementation", "--abi", "--only-binary", "--no-binary", "--src", "-C",
    "--config-settings", "--global-option", "--log", "--cache-dir", "--report",
    "--trusted-host", "--proxy", "--timeout", "--retries", "--exists-action", "--cert",
    "--client-cert", "--python", "--use-feature", "--root-user-action", "--keyring-provider",
    "--group", "--log-file", "--use-deprecated", "--hash",
}  # fmt: skip
_SHELL_OPERATORS = {"&&", "||", ";", "|", "&"}
_PIP = re.compile(r"pip(3(\.\d+)?)?")
REQUIREMENT = re.compile(
    r"[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9,._ -]*\])?([<>=!~][=<>!~A-Za-z0-9.*+,_ -]*)?"
)


def pip_install_requirements(line: str) -> list[str] | None:
    """The requirements (NAME[extras]SPEC) a command line's `pip install` asks for, as the
    kernel checks them against the wheelhouse and a recipe records them; paths, URLs and -r
    files are pip's to read. None when the line runs no pip install."""
    try:
        words = shlex.split(line)
    except ValueError:
        return None
    for at, word in enumerate(words[:-1]):
        starts = at == 0 or words[at - 1] in _SHELL_OPERATORS  # a command's first word
        named = (starts and _PIP.fullmatch(word.rsplit("/", 1)[-1])) or (
            word == "pip" and words[at - 1 : at] == ["-m"]
        )
        command = at + 1
        while command < len(words) and words[command].startswith("-"):  # pip -q install
            command += 1
        if named and words[command : command + 1] == ["install"]:
            return _requirements(words[command + 1 :])
    return None


def _requirements(args: list[str]) -> list[str]:
    found, skip = [], False
    for arg in args:
        if arg in _SHELL_OPERATORS:
            break
        if skip:
            skip = False
        elif arg.startswith("-"):
            skip = arg in PIP_VALUE_OPTIONS
        elif "/" not in arg and REQUIREMENT.fullmatch(arg) and not arg.endswith(".whl"):
            found.append(arg)
    return found


def requirement_name(requirement: str) -> str:
    """A requirement's project name, normalised as PEP 503 says."""
    match = re.match(r"[A-Za-z0-9._-]*", requirement)
    assert match is not None  # `*` matches the empty string: always a match
    name = match.group(0)
    return re.sub(r"[-_.]+", "-", name).lower()


CHECKS_PROGRAM = f"{SCRIPTS}/checks.py"  # a job's output checks, run as `python -I` by exec
# The supervisor's checker: an abstract Unix socket (no file model code could replace), bound
# by PID 1 as it starts, so no other process can take the name. Once the supervisor has
# pandas and pandera loaded (from a sandbox's first renewal on) it listens there and forks
# each check from itself; checks.py, run by the host, hands its request over.
CHECKS_SOCKET = "\0sandcell-checks"
CHECKS_SECONDS = 50  # a check run's whole time, killed at it (under the engine's 60 s a call)
# The host's commands run as the sandbox's uid in another group (sandbox/container.py): the
# sandbox's gid plus this. The supervisor serves its checker to that group only.
HELPER_GID_OFFSET = 1000
PEERCRED = struct.Struct("3i")  # SO_PEERCRED of a Unix socket: pid, uid, gid


def peer_credentials(conn: socket.socket) -> tuple[int, int, int]:
    """The pid, uid and gid of the process at the other end of a connected Unix socket, as
    the kernel recorded them when it connected (the supervisor's check of the helper, and the
    helper's that its peer is PID 1)."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, PEERCRED.size)
    return PEERCRED.unpack(creds)


def checks_answer_bytes(request: dict) -> int:
    """The most a checks answer takes: per output its head (base64) and 256 KiB for its
    verdict (failure examples escaped as JSON), and 1 MiB more."""
    per_output = (
        int(item.get("head_bytes", 0)) * 4 // 3 + (256 << 10) for item in request["outputs"]
    )
    return sum(per_output) + (1 << 20)


RELAY_PROGRAM = f"{SCRIPTS}/relay.py"
KERNEL_EXTENSION = "sandcell_kernel"
KERNEL_MODULE = "ipykernel_launcher"  # also how the host recognises a live kernel process
KERNEL_LOG = "/tmp/.sandcell-kernel.log"
FONT_CACHE = "/opt/mplcache"
# The kernel's own connection file and sockets, reached by the relay only: on a small tmpfs
# of their own when the host mounts one (a full /tmp cannot stop a restart), else in /tmp.
KERNEL_DIR = "/run/kernel"
KERNEL_DIR_FALLBACK = "/tmp/.sandcell-kernel"

# -- the connection folder: host-owned, bind-mounted, sealed once the kernel is up ----------
CONNECTION_DIR = "/run/sandcell"
CONNECTION_FILE = "kernel.json"  # written by the host
SOCKET_BASE = "kernel"  # the relay binds ipc sockets <SOCKET_BASE>-<port> in the folder
CHANNELS = {"shell": 1, "iopub": 2, "stdin": 3, "control": 4, "hb": 5}  # name -> ipc "port"


def socket_name(port: int) -> str:
    return f"{SOCKET_BASE}-{port}"


# -- the stream transport: the kernel's channels over an exec stream (sandbox/stream.py) -----
# With no folder shared with the host, the relay binds its sockets in CONNECTION_DIR on a tmpfs,
# and the host starts BRIDGE_PROGRAM with `docker exec` as a uid of its own (the sandbox's plus
# BRIDGE_UID_OFFSET, in the sandbox's group to reach the relay's sockets): model code can
# neither signal it nor open its /proc/<pid>/fd, and the supervisor's kills spare it. The
# bridge writes each new connection file into KEY_DIR, a tmpfs of its uid that model code
# cannot write to (gVisor's tmpfs ignores the sticky bit, and its SO_PEERCRED names the
# listener: neither a shared folder nor a socket could tell the bridge from model code).
STREAMED_ENV = "SANDCELL_STREAMED"  # "1" in a container the host reaches by the bridge
BRIDGE_PROGRAM = f"{SCRIPTS}/bridge.py"
BRIDGE_UID_OFFSET = 2000
KEY_DIR = "/run/sandcell-key"
KEY_WAIT_S = 60  # how long the supervisor waits for the first connection file
CONTROL = 0  # the channel number of the bridge's own messages (ready, errors)
STREAM_MAX_FRAMES = 64  # frames of one message, as the relay allows
STREAM_HEADER = struct.Struct(">BBI")  # channel, frame count, body length
STREAM_FRAME = struct.Struct(">I")  # each frame's length, before its bytes


def encode_message(channel: int, frames: list) -> bytes:
    """One message of the stream: its header, then each frame's length and bytes."""
    parts = [STREAM_HEADER.pack(channel, len(frames), 0)]
    for frame in frames:
        data = bytes(frame)
        parts += [STREAM_FRAME.pack(len(data)), data]
    body = sum(len(part) for part in parts) - STREAM_HEADER.size
    parts[0] = STREAM_HEADER.pack(channel, len(frames), body)
    return b"".join(parts)


class MessageReader:
    """Messages out of a stream of bytes fed in pieces, each checked as it comes: a known
    channel, at most STREAM_MAX_FRAMES frames, a body of at most `max_body` bytes whose frames
    fill it exactly. ValueError on anything else: the stream is then not to be read further."""

    def __init__(self, max_body: int):
        self.max_body = max_body
        self.buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, list[bytes]]]:
        self.buffer += data
        done = []
        while len(self.buffer) >= STREAM_HEADER.size:
            channel, count, size = STREAM_HEADER.unpack_from(self.buffer)
            if channel != CONTROL and channel not in CHANNELS.values():
                raise ValueError(f"a message on unknown channel {channel}")
            if not 0 < count <= STREAM_MAX_FRAMES or size > self.max_body:
                raise ValueError(f"a message of {count} frames and {size} bytes, over the caps")
            end = STREAM_HEADER.size + size
            if len(self.buffer) < end:
                break
            frames, at = [], STREAM_HEADER.size
            for _ in range(count):
                if at + STREAM_FRAME.size > end:
                    raise ValueError("a frame's length runs past its message")
                (length,) = STREAM_FRAME.unpack_from(self.buffer, at)
                at += STREAM_FRAME.size
                if at + length > end:
                    raise ValueError("a frame runs past its message")
                frames.append(bytes(self.buffer[at : at + length]))
                at += length
            if at != end:
                raise ValueError("a message's frames do not fill its body")
            del self.buffer[:end]
            done.append((channel, frames))
        return done


# -- signals the supervisor (PID 1) obeys when the host sends them --------------------------
RESTART = signal.SIGUSR1  # kill everything but PID 1, start a fresh kernel and relay
# kill everything but PID 1, empty every folder a job can write to (workspace, /tmp, /dev/shm,
# /dev/mqueue, the kernel's folder, the unsealed connection folder but its connection file),
# remove System V IPC objects, start a fresh kernel and relay; the container ends instead if
# a process outlives the kill or a file stays
RENEW = signal.SIGHUP
SWEEP = signal.SIGUSR2  # kill everything but PID 1, the kernel and the relay
# before a checkpoint (a pause): stop the relay, the one process holding sockets in the host's
# connection folder (gVisor cannot save a host socket); the kernel runs on
QUIESCE = signal.SIGPWR
NEW_RELAY = signal.SIGURG  # after a restore: a new relay for the same kernel
STOP = signal.SIGTERM  # kill everything and exit

# -- kinds of file, as a file's stat names them on both sides ---------------------------------
FILE_KINDS = [
    (stat.S_ISREG, "file"),
    (stat.S_ISDIR, "dir"),
    (stat.S_ISLNK, "symlink"),
    (stat.S_ISFIFO, "fifo"),
    (stat.S_ISCHR, "char"),
    (stat.S_ISBLK, "block"),
    (stat.S_ISSOCK, "socket"),
]


def kind_of(mode: int) -> str:
    return next((kind for test, kind in FILE_KINDS if test(mode)), "other")


# -- container labels ---------------------------------------------------------------------------
LABEL = "sandcell"  # every sandbox container carries it
OWNER_LABEL = "sandcell.owner"  # "<hostname>:<pid>" of the process that started it
SESSION_LABEL = "sandcell.session"
HOST_DIR_LABEL = "sandcell.conn"  # the host folder to delete with an orphan
# a short-lived helper of a sandbox (it fills a volume) or of a process (the transport probe):
# reaped as a sandbox is, never counted as one
HELPER_LABEL = "sandcell.helper"

# -- environment the host sets for the container ----------------------------------------------
OUTPUT_CHARS_ENV = "SANDCELL_OUTPUT_CHARS"  # stdout/stderr a cell may write before the cut
SPILL_BYTES_ENV = "SANDCELL_SPILL_BYTES"  # the most of one cell's output kept in its log
SPILL_BYTES = 64 << 20
# A cell that prints more than this keeps its whole output in a log under LOGS: the model's
# view of it may be cut (the default observation shows about 2400 characters of output).
SPILL_AFTER_CHARS = 2000
MAX_MESSAGE_ENV = "SANDCELL_MAX_MESSAGE_BYTES"  # the relay drops kernel messages over this
MAX_MESSAGE_BYTES = 16 << 20
# Rich outputs (display_data, execute_result) a cell may send, by count and by total size
# (rich_size): past either cap a display is not sent, and is counted in the rich marker.
RICH_OUTPUTS_ENV = "SANDCELL_RICH_OUTPUTS"
RICH_OUTPUTS = 32
RICH_BYTES_ENV = "SANDCELL_RICH_BYTES"
RICH_BYTES = 8 << 20  # 32 figures of 256 KB; one display may be at most this big

# The data behind a chart and a table, beside its image or text (images/sandcell_charts.py
# makes them; sandbox/rich_data.py checks them): JSON text, bounded by these caps.
CHART_MIME = "application/vnd.sandcell.chart+json"
TABLE_MIME = "application/vnd.sandcell.table+json"
DATA_BYTES = 128 << 10  # one chart's or table's JSON; the host drops a bigger one unread
CHART_POINTS = 2000  # points of a chart's series in all, kept evenly over each whole range
CHART_ELEMENTS = 100  # series, bars, wedges or boxes of one chart (a superchart: per axes)
CHART_AXES = 16  # charts of a superchart
CHART_TICKS = 50  # ticks of an axis
CHART_OUTLIERS = 50  # outliers of a box
TABLE_ROWS = 30  # the first rows of a table
TABLE_COLUMNS = 50
LABEL_CHARS = 200  # a title, label, name or table cell's text

# --allow-net: the container's way out (sandbox/net_proxy.py on the host, net_forwarder.py
# inside). The forwarder listens on 127.0.0.1:NET_PORT, which the proxy variables name; NET_ENV
# says there is one. ipc: the host's proxy socket is NET_SOCKET, in NET_DIR (a read-only
# mount). stream: NET_DIR is a tmpfs, NET_SOCKET the forwarder's dock, where the host's pipes
# (sandbox/net_link.py: `docker exec` of NET_PROGRAM --pipe, as the bridge's uid) wait.
NET_DIR = "/run/sandcell-net"
NET_SOCKET = f"{NET_DIR}/net.sock"
NET_PORT = 3128
NET_ENV = "SANDCELL_NET"
NET_PROGRAM = "/opt/sandcell/net_forwarder.py"

# -- metadata keys of a displayed result ---------------------------------------------------------
PATH_KEY = "sandcell/path"  # workspace path where an image was saved
ERROR_KEY = "sandcell/error"  # why it was not saved

# -- markers -----------------------------------------------------------------------------------
# Markers travel in the stream itself, so a cut stays in order with the text around it.
#   dropped <source> <count>  output cut here: <count> characters of a stream (source "stdout"
#                             or "stderr", cut by the kernel), or a message of <count> bytes
#                             the relay dropped (source "relay")
#   spill <path>              the cell's complete output is being written to <path>
#   spill-full <bytes>        ... and stopped at the cap of <bytes>
#   rich <count> <bytes>      at the end of a cell: rich outputs the kernel did not send (past
#                             the caps), and their rich_size. Sent after anything the cell
#                             wrote, in every stream it wrote to, so the last one the host
#                             reads is the kernel's: one printed by model code comes before.
RELAY = "relay"
_MARKER = "\n\x1b[sandcell-{kind} {value}]\n"
_MARKER_RE = re.compile(r"\n\x1b\[sandcell-(dropped|spill|spill-full|rich) ([^\]\n]+)\]\n")


def dropped_marker(source: str, count: int) -> str:
    return _MARKER.format(kind="dropped", value=f"{source} {count}")


def spill_marker(path: str) -> str:
    return _MARKER.format(kind="spill", value=path)


def spill_full_marker(cap: int) -> str:
    return _MARKER.format(kind="spill-full", value=cap)


def rich_marker(count: int, size: int) -> str:
    return _MARKER.format(kind="rich", value=f"{count} {size}")


def split_markers(text: str) -> list[str | tuple[str, str]]:
    """text as plain pieces and (kind, value) markers, in order."""
    pieces: list[str | tuple[str, str]] = []
    at = 0
    for match in _MARKER_RE.finditer(text):
        if match.start() > at:
            pieces.append(text[at : match.start()])
        pieces.append((match.group(1), match.group(2)))
        at = match.end()
    if at < len(text):
        pieces.append(text[at:])
    return pieces


def parse_dropped(value: str) -> tuple[str, int]:
    """A dropped marker's value: (source, count). Model code can print a marker too, so a
    value that is not one the container writes raises ValueError."""
    source, _, count = value.partition(" ")
    if source not in ("stdout", "stderr", RELAY) or not count.isdigit() or len(count) > 18:
        raise ValueError(f"not a dropped marker: {value[:80]!r}")
    return source, int(count)


def valid_spill(kind: str, value: str) -> bool:
    """Whether a spill marker is one the container writes (a log path, or a byte count)."""
    if kind == "spill":
        return value.startswith(LOGS + "/") and ".." not in value.split("/")
    return value.isdigit() and len(value) <= 18


def parse_rich(value: str) -> tuple[int, int]:
    """A rich marker's value: (count, bytes) of the rich outputs the kernel dropped; a value
    that is not one the kernel writes raises ValueError."""
    parts = value.split(" ")
    if len(parts) != 2 or not all(p.isdigit() and len(p) <= 18 for p in parts):
        raise ValueError(f"not a rich marker: {value[:80]!r}")
    return int(parts[0]), int(parts[1])


_END = object()


def rich_size(*values: object) -> int:
    """Size of a rich output (its data and metadata) as the caps count it: the UTF-8 bytes of
    every key and text value (bytes as their base64), 8 for any other scalar, 1 per list item.
    Close to its JSON size, and computed with one iterator per level of nesting, since the
    sender chooses how deep and how long its lists are."""
    total, stack = 0, [iter(values)]
    while stack:
        value = next(stack[-1], _END)
        if value is _END:
            stack.pop()
        elif isinstance(value, str):
            total += len(value) if value.isascii() else len(value.encode("utf-8", "replace"))
        elif isinstance(value, bytes | bytearray):
            total += (len(value) + 2) // 3 * 4
        elif isinstance(value, dict):
            total += sum(len(str(key)) for key in value)
            stack.append(iter(value.values()))
        elif isinstance(value, list | tuple):
            total += len(value)
            stack.append(iter(value))
        elif value is not None:
            total += 8
    return total
