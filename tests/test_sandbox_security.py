"""Escape and abuse battery against the real sandbox (real Docker, real kernel, no mocks).

Each probe runs hostile code in a container and asserts the safe outcome, then checks that
the next cell works (or that a fresh kernel does, as reported) and that the host is unharmed.
Harmless probes share one sandbox per group; destructive ones get a fresh sandbox each.
"""

import hashlib
import json
import os
import socket
import stat
import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest

from sandcell.sandbox import DockerSandbox, Limits, SandboxError, boundary, render
from sandcell.sandbox import container as ctr


@pytest.fixture(scope="module")
def runtime(runtime, transport):
    """Each sandbox test here runs under each runtime, and over each transport: the local
    engine's ipc, and the engine's API alone (stream) over TCP, as a remote engine is."""
    if transport == "podman" and runtime == "runsc":
        pytest.skip("Podman's Docker API takes no runtime: gVisor is not reachable through it")
    return runtime


# a test's own timeout mark, where it has one, wins over the module's
pytestmark = [pytest.mark.docker, pytest.mark.timeout(60)]

FAST = Limits(timeout_s=4, interrupt_grace_s=2)
# An allowlist in force (issue 51): the seal's probes and the timeout tests hold with one too
ALLOW_NET = ("internal:files.sandcell.test", "example.org")
SECRET_NAME = "SANDCELL_TEST_HOST_SECRET"
SECRET_VALUE = "host-secret-5f1c9a7e2b"


# -- helpers ------------------------------------------------------------------------------
def known_runsc_difference(runtime: str, request, reason: str, **xfail) -> None:
    """Under gVisor's runsc (2022-12) this test is expected to fail, for `reason`; `xfail`
    says how (strict=True: the day it passes, the test says so; raises=: only that way)."""
    if runtime == "runsc":
        request.applymarker(pytest.mark.xfail(reason=f"known difference: {reason}", **xfail))


def ok(sb: DockerSandbox, code: str, timeout: float | None = None) -> str:
    """Run code that must succeed; return its stdout."""
    ex = sb.run(code, timeout=timeout)
    assert ex.ok, render(ex)
    return ex.stdout


# Prepended to a probe: the sandbox's live processes (pid, command line), zombies left out.
LIVE_COMMANDS = """
import os

def live_commands():
    found = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            state = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[0]
            cmd = open(f"/proc/{p}/cmdline").read().replace("\\0", " ")
        except OSError:
            continue
        if state != "Z":
            found.append((int(p), cmd))
    return found
"""


def probe(sb: DockerSandbox, code: str, timeout: float | None = None) -> dict:
    """Run code whose last stdout line is a JSON report of what the probe saw."""
    out = ok(sb, code, timeout)
    return json.loads(out.strip().splitlines()[-1])


def assert_next_cell_works(sb: DockerSandbox) -> None:
    ex = sb.run("print(6 * 7)", timeout=15)
    assert ex.ok and ex.stdout.strip() == "42", render(ex)


def assert_a_fresh_kernel_kept_the_files(sb: DockerSandbox) -> None:
    """After a restart: `x` (set before) is gone, kept.txt (written before) is there, the next
    cell works and the host is unharmed."""
    after = sb.run("print(open('kept.txt').read()); x")
    assert after.stdout.strip() == "kept" and after.error.name == "NameError", render(after)
    assert_next_cell_works(sb)
    assert_host_unharmed(sb)


def assert_host_unharmed(sb: DockerSandbox) -> None:
    """The connection directory on the host is sealed again, holds only the kernel's
    files, and the container still runs with its limits. Over the stream transport the
    host's folder was never mounted: private to the host user, its own sockets alone, and
    the container has no bind mount at all."""
    mode = stat.S_IMODE(os.stat(sb.conn_dir).st_mode)
    entries = os.listdir(sb.conn_dir)
    sb.container.reload()
    if sb.streamed:
        assert mode == 0o700, oct(mode)
        assert set(entries) <= {f"kernel-{port}" for port in range(1, 6)}, entries
        assert [m for m in sb.container.attrs["Mounts"] if m["Type"] == "bind"] == []
    else:
        assert mode == 0o555, oct(mode)
        assert "kernel.json" in entries and len(entries) <= 8, entries
    assert sb.container.status == "running"


def host_cgroup(sb: DockerSandbox, controller: str) -> Path:
    """The container's folder of one cgroup v1 controller, read on the host: gVisor shows no
    cgroup files inside, but the host's cgroup holds the whole sandbox all the same."""
    pid = sb.container.attrs["State"]["Pid"]
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return Path("/sys/fs/cgroup", controller, path.lstrip("/"))
    raise AssertionError(f"no {controller} cgroup for the container's pid {pid}")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


TRY = """
import json, os, errno
def attempt(fn):
    try:
        fn()
    except BaseException as e:
        return f"{type(e).__name__}:{getattr(e, 'errno', None)}"
    return "ALLOWED"
"""


@pytest.fixture(scope="module", params=[(), ALLOW_NET], ids=["sealed", "allow-net"])
def allow_net(request, transport) -> tuple[str, ...]:
    """No allowlist (today's sandbox), then ALLOW_NET: the proxy variables set, the forwarder
    running, and the proxy's socket mounted (ipc) or the host's pipes at its dock (stream).
    Podman's is the stream path again (tests/test_net_transports.py runs a cell there)."""
    if request.param and transport == "podman":
        pytest.skip("--allow-net over Podman: the stream transport's path, tested over TCP")
    return request.param


# -- the shared sandbox: probes that cannot harm it -------------------------------------
@pytest.fixture(scope="module")
def host_only(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hostonly")
    secret_file = folder / "host-only-secret.txt"
    secret_file.write_text("only on the host\n")
    data = folder / "input.csv"
    data.write_bytes(b"a,b\n1,2\n3,4\n" * 1000)
    return {"file": secret_file, "input": data, "sha": sha256(data)}


@pytest.fixture(scope="module")
def shared(host_only, runtime, allow_net):
    limits = Limits(timeout_s=4, interrupt_grace_s=2, allow_net=allow_net)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(SECRET_NAME, SECRET_VALUE)
        mp.setenv("DOCKER_HOST", "unix:///var/run/docker.sock")
        sb = DockerSandbox(limits=limits, inputs=[host_only["input"]], runtime=runtime)
    with sb:
        yield sb
    assert sha256(host_only["input"]) == host_only["sha"]


shared_group = pytest.mark.xdist_group("security-shared")


@shared_group
def test_the_runtime_asked_for_is_the_one_running(shared, runtime):
    """The engine says so, and so does the kernel the code sees: gVisor's Sentry answers
    uname itself (an old, fixed release), runc shares the host's kernel."""
    inside = ok(shared, "import os\nprint(os.uname().release)").strip()
    assert shared.container.attrs["HostConfig"]["Runtime"] == runtime
    if runtime == "runsc":
        assert inside != os.uname().release, inside
    else:
        assert inside == os.uname().release, inside


@shared_group
def test_outbound_connection_by_ip_fails(shared):
    r = probe(
        shared,
        TRY
        + """
import socket
def tcp(host, port):
    socket.create_connection((host, port), timeout=2).close()
def udp():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.sendto(b"x", ("8.8.8.8", 53))
print(json.dumps({"tcp1": attempt(lambda: tcp("1.1.1.1", 443)),
                  "tcp2": attempt(lambda: tcp("8.8.8.8", 53)),
                  "udp": attempt(udp),
                  "v6": attempt(lambda: socket.create_connection(("2606:4700:4700::1111", 443), 2))}))
""",
    )
    assert all(v != "ALLOWED" for v in r.values()), r
    assert_next_cell_works(shared)


@shared_group
def test_outbound_connection_by_name_and_dns_fail(shared):
    r = probe(
        shared,
        TRY
        + """
import socket, urllib.request
print(json.dumps({
    "resolve": attempt(lambda: socket.getaddrinfo("pypi.org", 443)),
    "resolve_localhost_net": attempt(lambda: socket.gethostbyname("example.com")),
    "http": attempt(lambda: urllib.request.urlopen("http://example.com", timeout=2)),
    "https": attempt(lambda: urllib.request.urlopen("https://pypi.org/simple/", timeout=2)),
}))
""",
    )
    assert all(v != "ALLOWED" for v in r.values()), r
    assert r["resolve"].startswith("gaierror"), r


@shared_group
def test_only_loopback_interface(shared):
    r = probe(
        shared,
        """
import json, os, socket
print(json.dumps({"sys": sorted(os.listdir("/sys/class/net")),
                  "if": sorted(n for _, n in socket.if_nameindex()),
                  "route": open("/proc/net/route").read().splitlines()[1:]}))
""",
    )
    assert r["sys"] == ["lo"] and r["if"] == ["lo"], r
    assert r["route"] == [], r  # no route anywhere, not even a default one


@shared_group
def test_cloud_metadata_address_unreachable(shared):
    r = probe(
        shared,
        TRY
        + """
import socket, urllib.request
print(json.dumps({
    "tcp": attempt(lambda: socket.create_connection(("169.254.169.254", 80), timeout=2)),
    "http": attempt(lambda: urllib.request.urlopen(
        "http://169.254.169.254/latest/meta-data/", timeout=2)),
}))
""",
    )
    assert all(v != "ALLOWED" for v in r.values()), r


@shared_group
def test_no_docker_socket_and_no_docker_host(shared):
    r = probe(
        shared,
        """
import json, os, stat
paths = ["/var/run/docker.sock", "/run/docker.sock", "/run/containerd/containerd.sock",
         "/var/run/containerd/containerd.sock", "/run/podman/podman.sock"]
sockets = []
for top in ("/run", "/var/run", "/tmp", "/workspace", "/data", "/"):
    try:
        for name in os.listdir(top):
            p = os.path.join(top, name)
            if stat.S_ISSOCK(os.lstat(p).st_mode):
                sockets.append(p)
    except OSError:
        pass
print(json.dumps({"exists": [p for p in paths if os.path.lexists(p)], "sockets": sockets,
                  "env": os.environ.get("DOCKER_HOST")}))
""",
    )
    assert r["exists"] == [] and r["sockets"] == [], r
    assert r["env"] is None, r


@shared_group
def test_host_only_files_invisible(shared, host_only):
    host_file = str(host_only["file"])
    r = probe(
        shared,
        f"""
import json, os, socket
print(json.dumps({{"exists": os.path.exists({host_file!r}),
                   "dir": os.path.exists({str(host_only["file"].parent)!r}),
                   "hostname": open("/etc/hostname").read().strip(),
                   "data": sorted(os.listdir("/data")),
                   "home": os.path.exists("/root/.bash_history") or os.path.exists("/home")
                           and bool(os.listdir("/home"))}}))
""",
    )
    assert r["exists"] is False and r["dir"] is False, r
    assert r["hostname"] != socket.gethostname(), r
    assert r["data"] == ["input.csv"], r  # only the one input file, never its folder
    assert r["home"] is False, r


@shared_group
def test_root_filesystem_read_only(shared):
    r = probe(
        shared,
        TRY
        + """
def write(p):
    open(p, "w").write("x")
targets = ["/etc/passwd", "/etc/sandcell-x", "/usr/bin/sandcell-x", "/opt/venv/bin/python3",
           "/opt/sandcell/supervisor.py", "/sandcell-x", "/data/new-file", "/run/sandcell/x"]
ro = [l.split()[3] for l in open("/proc/mounts") if l.split()[1] == "/"]
print(json.dumps({"writes": {p: attempt(lambda p=p: write(p)) for p in targets},
                  "root_opts": ro}))
""",
    )
    assert all(v != "ALLOWED" for v in r["writes"].values()), r
    assert "ro" in r["root_opts"][0].split(","), r
    assert_next_cell_works(shared)


@shared_group
def test_input_file_cannot_be_changed(shared, host_only):
    r = probe(
        shared,
        TRY
        + """
import shutil
p = "/data/input.csv"
print(json.dumps({
    "append": attempt(lambda: open(p, "ab").write(b"evil")),
    "truncate": attempt(lambda: os.truncate(p, 0)),
    "chmod": attempt(lambda: os.chmod(p, 0o666)),
    "unlink": attempt(lambda: os.unlink(p)),
    "rename": attempt(lambda: os.rename(p, "/data/x.csv")),
    "replace": attempt(lambda: shutil.copy("/etc/hostname", p)),
    "readable": len(open(p, "rb").read()),
    "mount": [l.split()[3] for l in open("/proc/mounts") if l.split()[1] == p],
}))
""",
    )
    readable = r.pop("readable")
    assert "ro" in r.pop("mount")[0].split(","), r  # a read-only bind, whatever its mode
    assert readable == host_only["input"].stat().st_size
    assert all(v != "ALLOWED" for v in r.values()), r
    assert sha256(host_only["input"]) == host_only["sha"]


STATUS = """
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
status = dict(l.split(":", 1) for l in open("/proc/self/status"))
PR_GET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_IS_SET = 39, 47, 1
print(json.dumps({"uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(),
                  "groups": os.getgroups(),
                  "caps": {k: int(status[k].strip(), 16) for k in
                           ("CapEff", "CapPrm", "CapInh", "CapBnd", "CapAmb") if k in status},
                  "ambient": [c for c in range(64)
                              if libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_IS_SET, c, 0, 0) == 1],
                  "nnp": status.get("NoNewPrivs", "").strip(),
                  "nnp_prctl": libc.prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0),
                  "seccomp": status["Seccomp"].strip()}))
"""


@shared_group
def test_non_root_without_capabilities_and_no_new_privs(shared, runtime):
    r = probe(shared, STATUS)
    assert r["uid"] != 0 and r["euid"] != 0 and r["gid"] != 0 and 0 not in r["groups"], r
    assert all(v == 0 for v in r["caps"].values()), r
    assert r["ambient"] == [], r
    # gVisor's /proc/self/status has no CapAmb or NoNewPrivs line; prctl answers for both
    expected = {"CapEff", "CapPrm", "CapInh", "CapBnd"} | (
        {"CapAmb"} if runtime == "runc" else set()
    )
    assert set(r["caps"]) >= expected, r
    assert r["nnp_prctl"] == 1 and r["nnp"] in ("1", "" if runtime == "runsc" else "1"), r


@shared_group
def test_docker_default_seccomp_filter_is_on(shared, runtime):
    if runtime == "runsc":
        pytest.skip(
            "gVisor's Sentry serves the system calls itself and does not load Docker's seccomp "
            "profile inside the sandbox (Seccomp: 0); runsc --oci-seccomp would, but under it "
            "libzmq's threads fail with EPERM in runsc 2022-12. The Sentry's own seccomp "
            "filter against the host kernel is gVisor's wall."
        )
    assert probe(shared, STATUS)["seccomp"] == "2"  # Docker's default seccomp filter is on


@shared_group
def test_no_setuid_or_setgid_binaries(shared):
    r = probe(
        shared,
        """
import json, os, stat
found = []
for top in ("/usr", "/bin", "/sbin", "/lib", "/opt", "/etc", "/var"):
    for root, dirs, files in os.walk(top):
        for name in files:
            p = os.path.join(root, name)
            try:
                mode = os.lstat(p).st_mode
            except OSError:
                continue
            if stat.S_ISREG(mode) and mode & (stat.S_ISUID | stat.S_ISGID):
                found.append(p)
print(json.dumps({"found": found}))
""",
        timeout=40,
    )
    assert r["found"] == [], r


@shared_group
def test_setuid_to_root_chroot_mknod_fail(shared):
    r = probe(
        shared,
        TRY
        + """
print(json.dumps({
    "setuid0": attempt(lambda: os.setuid(0)),
    "setgid0": attempt(lambda: os.setgid(0)),
    "chroot": attempt(lambda: os.chroot("/tmp")),
    "devmem": attempt(lambda: open("/dev/mem", "rb").read(1)),
    "kmsg": attempt(lambda: open("/dev/kmsg", "rb").read(1)),
}))
""",
    )
    assert all(v != "ALLOWED" for v in r.values()), r


@shared_group
def test_mknod_of_a_device_fails(shared, runtime, request):
    known_runsc_difference(  # strict: the day gVisor refuses it, this says so
        runtime,
        request,
        "runsc 2022-12 lets mknod make device nodes without "
        "CAP_MKNOD; they reach only gVisor's own devices "
        "(test_device_nodes_reach_no_host_device)",
        strict=True,
    )
    r = probe(
        shared,
        TRY + 'print(json.dumps({"mknod": attempt(lambda: os.mknod("/tmp/sda-a", '
        "0o600 | 0o060000, os.makedev(8, 0)))}))",
    )
    assert r["mknod"] != "ALLOWED", r


@shared_group
def test_device_nodes_reach_no_host_device(shared):
    """Whatever mknod allows, a node for the host's disk, memory, kernel log or I/O ports
    does not open: ENXIO (no such device), EACCES/EPERM, or mknod refused in the first place."""
    r = probe(
        shared,
        TRY
        + """
out = {}
for name, kind, major, minor in [("sda", 0o060000, 8, 0), ("mem", 0o020000, 1, 1),
                                 ("kmsg", 0o020000, 1, 11), ("port", 0o020000, 1, 4)]:
    p = f"/tmp/node-{name}"
    made = attempt(lambda: os.mknod(p, 0o666 | kind, os.makedev(major, minor)))
    out[name] = attempt(lambda: os.close(os.open(p, os.O_RDWR))) if made == "ALLOWED" else made
    made == "ALLOWED" and os.unlink(p)
print(json.dumps(out))
""",
    )
    assert all(v != "ALLOWED" for v in r.values()), r


@shared_group
def test_mount_unshare_fail(shared, runtime):
    r = probe(
        shared,
        TRY
        + """
import ctypes, subprocess
libc = ctypes.CDLL(None, use_errno=True)
def call(fn, *args):
    def run():
        if fn(*args) != 0:
            e = ctypes.get_errno(); raise OSError(e, os.strerror(e))
    return run
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWNET, CLONE_NEWPID = 0x20000, 0x10000000, 0x40000000, 0x20000000
# unshare in a child so a success could not change the kernel itself
def in_child(flag):
    code = ("import ctypes, os, sys; l = ctypes.CDLL(None, use_errno=True); "
            f"sys.exit(0 if l.unshare({flag}) == 0 else 3)")
    def run():
        rc = subprocess.run(["python3", "-c", code]).returncode
        if rc != 0:
            raise OSError(rc, "unshare refused")
    return run
print(json.dumps({
    "mount_tmpfs": attempt(call(libc.mount, b"none", b"/tmp", b"tmpfs", 0, None)),
    "remount_root_rw": attempt(call(libc.mount, None, b"/", None, 32 | 4096, None)),
    "umount_data": attempt(call(libc.umount2, b"/data/input.csv", 2)),
    "unshare_user": attempt(in_child(CLONE_NEWUSER)),
    "unshare_ns": attempt(in_child(CLONE_NEWNS)),
    "unshare_net": attempt(in_child(CLONE_NEWNET)),
    "unshare_pid": attempt(in_child(CLONE_NEWPID)),
}))
""",
    )
    allowed = {k for k, v in r.items() if v == "ALLOWED"}
    if runtime == "runsc" and allowed and allowed <= {k for k in r if k.startswith("unshare")}:
        assert_next_cell_works(shared)
        pytest.xfail(
            f"known difference: runsc 2022-12 lets {sorted(allowed)} succeed (Docker's seccomp "
            "profile is not loaded inside gVisor); the namespaces are the Sentry's own, and "
            "every mount is still refused"
        )
    assert not allowed, r
    assert_next_cell_works(shared)


@shared_group
@pytest.mark.parametrize("target", ["supervisor.py", "relay.py"])
def test_supervisor_and_relay_cannot_be_ptraced_or_read(shared, target, runtime):
    """PID 1 and the relay to the host run as the kernel's uid; both are non-dumpable."""
    r = probe(
        shared,
        TRY
        + f"TARGET = {target!r}\n"
        + """
import ctypes
pid = next(int(p) for p in os.listdir("/proc") if p.isdigit()
           and TARGET in open(f"/proc/{p}/cmdline").read())
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
def ptrace(req):
    def run():
        if libc.ptrace(req, pid, None, None) != 0:
            e = ctypes.get_errno(); raise OSError(e, os.strerror(e))
    return run
status = dict(l.split(":", 1) for l in open(f"/proc/{pid}/status"))
print(json.dumps({
    "attach": attempt(ptrace(16)),      # PTRACE_ATTACH
    "seize": attempt(ptrace(0x4206)),   # PTRACE_SEIZE
    "mem": attempt(lambda: open(f"/proc/{pid}/mem", "rb").read(1)),
    "environ": attempt(lambda: open(f"/proc/{pid}/environ", "rb").read()),
    "root": attempt(lambda: os.listdir(f"/proc/{pid}/root")),
    "fd": attempt(lambda: os.listdir(f"/proc/{pid}/fd")),
    "maps": attempt(lambda: open(f"/proc/{pid}/maps").read(1)),
    "tracer": status["TracerPid"].strip(),
    "cmd": open(f"/proc/{pid}/cmdline").read(),
}))
""",
    )
    assert r.pop("tracer") == "0"
    assert target in r.pop("cmd")
    allowed = {k for k, v in r.items() if v == "ALLOWED"}
    if runtime == "runsc" and allowed and allowed <= {"environ", "root", "fd", "maps"}:
        assert_next_cell_works(shared)  # ptrace and /proc/<pid>/mem are refused
        pytest.xfail(
            f"known difference: gVisor's /proc (runsc 2022-12) shows {sorted(allowed)} of a "
            "non-dumpable process of the same uid; ptrace and its memory stay refused"
        )
    assert not allowed, r
    assert_next_cell_works(shared)


@shared_group
def test_sysrq_and_kernel_knobs_unwritable(shared):
    r = probe(
        shared,
        TRY
        + """
print(json.dumps({
    "sysrq": attempt(lambda: open("/proc/sysrq-trigger", "w").write("h")),
    "core_pattern": attempt(lambda: open("/proc/sys/kernel/core_pattern", "w").write("|/x")),
    "hostname": attempt(lambda: open("/proc/sys/kernel/hostname", "w").write("x")),
    "drop_caches": attempt(lambda: open("/proc/sys/vm/drop_caches", "w").write("3")),
    "cgroup": attempt(lambda: open("/sys/fs/cgroup/memory/memory.limit_in_bytes", "w").write("-1")),
}))
""",
    )
    assert all(v != "ALLOWED" for v in r.values()), r


@shared_group
def test_host_secret_env_not_visible(shared):
    assert os.environ.get(SECRET_NAME) is None  # the fixture's patch is undone
    r = probe(
        shared,
        f"""
import json, os, subprocess
found = []
for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
    try:
        if {SECRET_VALUE!r}.encode() in open(f"/proc/{{pid}}/environ", "rb").read():
            found.append(pid)
    except OSError:
        pass
child = subprocess.run(["env"], capture_output=True, text=True).stdout
print(json.dumps({{"env": {SECRET_NAME!r} in os.environ, "proc": found,
                   "child": {SECRET_VALUE!r} in child,
                   "any": any({SECRET_VALUE!r} in v for v in os.environ.values())}}))
""",
    )
    assert r == {"env": False, "proc": [], "child": False, "any": False}, r


@shared_group
def test_connection_directory_sealed(shared):
    """The folder the kernel's key comes from: the host's (ipc), or the bridge's (stream)."""
    folder = boundary.KEY_DIR if shared.streamed else boundary.CONNECTION_DIR
    r = probe(
        shared,
        TRY
        + f"d = {folder!r}\n"
        + """
print(json.dumps({
    "create": attempt(lambda: open(f"{d}/fill", "wb").write(b"x")),
    "mkdir": attempt(lambda: os.mkdir(f"{d}/sub")),
    "chmod_dir": attempt(lambda: os.chmod(d, 0o777)),
    "chmod_json": attempt(lambda: os.chmod(f"{d}/kernel.json", 0o666)),
    "write_json": attempt(lambda: open(f"{d}/kernel.json", "a").write("x")),
    "unlink_json": attempt(lambda: os.unlink(f"{d}/kernel.json")),
    "rename_json": attempt(lambda: os.rename(f"{d}/kernel.json", f"{d}/k2.json")),
    "symlink": attempt(lambda: os.symlink("/etc/passwd", f"{d}/link")),
}))
""",
    )
    assert all(v != "ALLOWED" for v in r.values()), r
    assert_host_unharmed(shared)


@shared_group
def test_resource_limits_are_set(shared, runtime):
    r = probe(
        shared,
        """
import json, os, resource
def size(p):
    s = os.statvfs(p); return s.f_blocks * s.f_frsize
cg = "/sys/fs/cgroup"
def read(p):
    try:
        return open(p).read().strip()
    except OSError:
        return None
print(json.dumps({"nofile": resource.getrlimit(resource.RLIMIT_NOFILE),
                  "nproc": resource.getrlimit(resource.RLIMIT_NPROC),
                  "tmp": size("/tmp"), "ws": size("/workspace"),
                  "shm": size("/dev/shm") if os.path.exists("/dev/shm") else 0,
                  "mem": read(f"{cg}/memory/memory.limit_in_bytes") or read(f"{cg}/memory.max"),
                  "memsw": read(f"{cg}/memory/memory.memsw.limit_in_bytes"),
                  "pids": read(f"{cg}/pids/pids.max") or read(f"{cg}/pids.max")}))
""",
    )
    limits = shared.limits
    assert r["nofile"] == [limits.open_files, limits.open_files], r
    assert r["tmp"] == limits.tmp_mb << 20 and r["ws"] == limits.workspace_mb << 20, r
    assert r["shm"] <= 64 << 20, r
    if runtime == "runsc":  # no cgroup files inside gVisor: the host's cgroup holds them
        assert r["mem"] is None and r["pids"] is None, r
        r["mem"] = (host_cgroup(shared, "memory") / "memory.limit_in_bytes").read_text()
        r["pids"] = (host_cgroup(shared, "pids") / "pids.max").read_text().strip()
        # the sandbox's own count is held by gVisor's kernel; the cgroup holds the Sentry
        assert r["nproc"] == [limits.pids, limits.pids], r
        assert r["pids"] == str(1024 + 8 * limits.pids), r
    else:  # there RLIMIT_NPROC would count every host process of the uid: the cgroup holds it
        assert r["nproc"] != [limits.pids, limits.pids] and r["pids"] == str(limits.pids), r
    assert int(r["mem"]) == limits.memory_mb << 20, r
    host = shared.container.attrs["HostConfig"]
    assert host["Memory"] == host["MemorySwap"] == limits.memory_mb << 20  # no swap
    assert host["NetworkMode"] == "none" and host["ReadonlyRootfs"] is True
    assert host["CapDrop"] == ["ALL"] and not host.get("CapAdd")
    assert host["Privileged"] is False


@shared_group
@pytest.mark.timeout(150)
def test_container_logs_bounded_and_pid1_stdout_unreachable(shared, runtime):
    log = shared.container.attrs["HostConfig"]["LogConfig"]
    assert log["Type"] == "none" or log["Config"].get("max-size"), log
    r = probe(
        shared,
        TRY
        + """
print(json.dumps({
    "pid1_out": attempt(lambda: open("/proc/1/fd/1", "w").write("x" * 1000)),
    "pid1_err": attempt(lambda: open("/proc/1/fd/2", "w").write("x" * 1000)),
}))
""",
    )
    # what the kernel writes to its own fds 1 and 2 does not reach `docker logs` either
    ok(
        shared,
        "import os\nfor _ in range(64): os.write(1, b'y' * 65536); os.write(2, b'z' * 65536)",
        timeout=60,  # 8 MB through gVisor beside three other workers: more than the usual 5 s
    )
    logs = shared.container.logs(tail=1000)
    assert len(logs) < 64 << 10 or r["pid1_out"] == "ALLOWED", len(logs)
    if runtime == "runsc" and set(r.values()) == {"ALLOWED"}:
        # the log driver's cap holds what reaches PID 1's stdout: 8 MiB leave at most 2 MiB
        ok(shared, "f = open('/proc/1/fd/1', 'w')\nfor _ in range(8): f.write('x' * (1 << 20))")
        kept = len(shared.container.logs())  # the log file itself may be mid-rotation
        assert kept < 2 << 20, kept
        pytest.xfail(
            "known difference: gVisor's /proc (runsc 2022-12) lets code open /proc/1/fd/1 and 2 "
            "of the non-dumpable supervisor (same uid); the json-file cap bounds what lands"
        )
    assert all(v != "ALLOWED" for v in r.values()), r


# -- destructive probes: a fresh sandbox each ---------------------------------------------
@pytest.mark.xdist_group("security-a")
@pytest.mark.timeout(90)
def test_signals_to_pid1_from_inside_are_ignored(runtime, request):
    known_runsc_difference(
        runtime,
        request,
        "runsc 2022-12 does not shield a PID namespace's init "
        "from SIGKILL and SIGHUP sent inside it, and the supervisor runs as the kernel's "
        "uid: model code can end its own sandbox (the host sees the container stop)",
        strict=True,
    )
    with DockerSandbox(limits=FAST, runtime=runtime) as sb:
        before = ok(sb, "import os\nx = 41\nprint(os.getpid())").strip()
        r = probe(
            sb,
            TRY
            + """
import signal, time
out = {s.name: attempt(lambda s=s: os.kill(1, s)) for s in
       (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT, signal.SIGHUP,
        signal.SIGKILL)}
time.sleep(1)
out["pid1_alive"] = os.path.exists("/proc/1/cmdline")
print(json.dumps(out))
""",
        )
        assert r["pid1_alive"] is True
        after = sb.run("print(os.getpid()); x + 1")
        assert after.ok and after.stdout.strip() == before and after.text == "42", render(after)
        assert_host_unharmed(sb)


@pytest.mark.xdist_group("security-a")
@pytest.mark.timeout(300)  # under gVisor the engine's kill can wait 60 s on a thrashing Sentry
def test_fork_bomb_is_bounded_by_pids_limit(runtime, request):
    known_runsc_difference(  # not strict: on a quiet machine the sandbox may survive it
        runtime,
        request,
        "under gVisor the bomb's processes, held to the limit by its kernel, still fill the "
        "sandbox's memory (seen: 'out of memory') or the Sentry's host threads: "
        "the whole sandbox stops (the host sees the container exit; nothing outlives it)",
        raises=SandboxError,
    )
    limits = Limits(timeout_s=4, interrupt_grace_s=2, pids=64)
    with DockerSandbox(limits=limits, runtime=runtime) as sb:
        host = sb.container.attrs["HostConfig"]
        if sb.gvisor:  # gVisor's kernel counts the sandbox's tasks; the cgroup holds the Sentry
            assert {"Name": "nproc", "Soft": 64, "Hard": 64} in host["Ulimits"], host["Ulimits"]
            assert host["PidsLimit"] == 1024 + 8 * 64
        else:
            assert host["PidsLimit"] == 64
        ok(sb, "open('before.txt', 'w').write('kept')")
        ex = sb.run(
            "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n"
            "        pass\n"
        )
        assert ex.timed_out and (ex.interrupted or ex.restarted == "timeout"), render(ex)
        assert len(render(ex, 2000)) <= 2000
        # the bomb's processes are gone, the workspace is intact, the next cell works
        r = probe(
            sb,
            "import json, os\nprint(json.dumps({'n': sum(p.isdigit() for p in "
            "os.listdir('/proc')), 'kept': open('before.txt').read()}))",
        )
        assert r["kept"] == "kept" and r["n"] < 16, r
        assert_next_cell_works(sb)
        assert_host_unharmed(sb)


@pytest.mark.xdist_group("security-b")
@pytest.mark.timeout(150)
def test_memory_bomb_restarts_kernel_reported_as_out_of_memory(runtime, request):
    known_runsc_difference(
        runtime,
        request,
        "under gVisor the memory limit holds the whole sandbox "
        "(Sentry, and the tmpfs workspace in its memory): the host's OOM killer ends "
        "the container, reported as 'stopped ... out of memory', workspace lost",
        raises=SandboxError,
    )
    limits = Limits(timeout_s=60, interrupt_grace_s=2, memory_mb=300)
    with DockerSandbox(limits=limits, runtime=runtime) as sb:
        ok(sb, "x = 1\nopen('kept.txt', 'w').write('kept')")
        ex = sb.run("b = []\nwhile True:\n    b.append(bytearray(16 << 20))\n")
        assert ex.restarted == "out of memory", render(ex)
        assert not ex.timed_out and ex.duration_s < 40, ex.duration_s  # the restart included
        assert "out of memory" in render(ex)
        assert_a_fresh_kernel_kept_the_files(sb)


@pytest.mark.xdist_group("security-c")
@pytest.mark.timeout(90)
def test_disk_fill_of_tmp_and_workspace_hits_enospc_within_tmpfs_sizes(runtime):
    limits = Limits(timeout_s=20, interrupt_grace_s=2, tmp_mb=32, workspace_mb=48)
    with DockerSandbox(limits=limits, runtime=runtime) as sb:
        r = probe(
            sb,
            """
import errno, json, os
def fill(path):
    written, chunk = 0, b"\\0" * (1 << 20)
    try:
        with open(path, "wb") as f:
            while written < (1 << 30):
                f.write(chunk); f.flush(); written += len(chunk)
    except OSError as e:
        return {"errno": e.errno, "written": written}
    return {"errno": None, "written": written}
print(json.dumps({"tmp": fill("/tmp/fill"), "ws": fill("/workspace/fill"),
                  "shm": fill("/dev/shm/fill") if os.path.isdir("/dev/shm") else None}))
""",
        )
        assert r["tmp"]["errno"] == 28 and r["tmp"]["written"] <= 32 << 20, r
        assert r["ws"]["errno"] == 28 and r["ws"]["written"] <= 48 << 20, r
        if r["shm"] is not None:
            assert r["shm"]["errno"] in (28, 13, 30) and r["shm"]["written"] <= 64 << 20, r
        # a full workspace: the sandbox still answers, reports, and recovers once freed
        assert_next_cell_works(sb)
        ok(sb, "import os\nos.remove('/tmp/fill'); os.remove('/workspace/fill')")
        assert_next_cell_works(sb)
        assert_host_unharmed(sb)
        # Nothing landed on the host's disk: not in the container's writable layer, its
        # connection directory or its log. Per-container figures, not the host's free space,
        # which moves with whatever the other test workers write meanwhile.
        size_rw = subprocess.run(
            ["docker", "inspect", "--size", "-f", "{{.SizeRw}}", sb.container.id],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        assert int(size_rw or 0) < 1 << 20, size_rw
        conn = sum(f.stat().st_size for f in Path(sb.conn_dir).rglob("*") if f.is_file())
        assert conn < 1 << 20, conn
        sb.container.reload()
        log = sb.container.attrs.get("LogPath")
        assert not log or not os.path.exists(log) or os.path.getsize(log) < 2 << 20


@pytest.mark.xdist_group("security-c")
@pytest.mark.timeout(90)
def test_huge_single_file_and_thousands_of_small_files(runtime):
    limits = Limits(timeout_s=30, interrupt_grace_s=2, workspace_mb=64)
    with DockerSandbox(limits=limits, runtime=runtime) as sb:
        r = probe(
            sb,
            TRY
            + """
def falloc():
    fd = os.open("/workspace/huge", os.O_WRONLY | os.O_CREAT)
    try:
        os.posix_fallocate(fd, 0, 10 << 30)
    finally:
        os.close(fd)
def dense():
    with open("/workspace/dense", "wb") as f:
        f.seek(100 << 20); f.write(b"x")
        f.seek(0); f.write(b"\\1" * (100 << 20))
print(json.dumps({"fallocate": attempt(falloc), "dense": attempt(dense)}))
""",
        )
        assert r["fallocate"].endswith(":28") and r["dense"].endswith(":28"), r
        ok(sb, "import os\nfor p in ('huge', 'dense'):\n    os.path.exists(p) and os.remove(p)")
        r = probe(
            sb,
            """
import json, os
os.makedirs("many", exist_ok=True)
made, err = 0, None
try:
    for i in range(20000):
        with open(f"many/f{i}", "w") as f:
            f.write("x")
        made += 1
except OSError as e:
    err = e.errno
print(json.dumps({"made": made, "err": err}))
""",
        )
        assert r["made"] == 20000 or r["err"] in (28, 24), r
        started = time.monotonic()
        listing = sb.files()
        assert len(listing) >= r["made"] and time.monotonic() - started < 20
        assert_next_cell_works(sb)
        assert_host_unharmed(sb)


class PeakRss:
    """Samples this process's RSS every 5 ms in a thread; `growth` is the peak increase."""

    def __init__(self):
        self.proc = psutil.Process()
        self.base = self.proc.memory_info().rss
        self.peak = self.base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(0.005)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    @property
    def growth(self) -> int:
        return self.peak - self.base


@pytest.mark.xdist_group("security-d")
@pytest.mark.timeout(120)
def test_one_gigabyte_print_keeps_host_memory_bounded(runtime):
    with DockerSandbox(limits=Limits(timeout_s=60, interrupt_grace_s=2), runtime=runtime) as sb:
        assert_next_cell_works(sb)  # warm up the client before measuring
        with PeakRss() as rss:
            ex = sb.run(
                "import sys\nline = 'x' * 1023 + '\\n'\nblock = line * 1024\n"
                "for _ in range(1024):\n    sys.stdout.write(block)\nprint('END')"
            )
        assert ex.ok, render(ex)
        assert rss.growth < 64 << 20, rss.growth
        assert ex.dropped_bytes > 1000 << 20, ex.dropped_bytes
        assert len(ex.stdout) <= sb.limits.output_bytes + 200
        assert ex.stdout.rstrip().endswith("END")  # the tail survives the cut
        text = render(ex, 4000)
        assert len(text) <= 4000 and "cut" in text
        assert ex.saved_output and sb.read(ex.saved_output)  # the kept text was saved
        assert_next_cell_works(sb)


@pytest.mark.xdist_group("security-d")
@pytest.mark.timeout(120)
def test_output_sent_around_the_kernel_cap_is_capped_on_the_host(runtime):
    """Model code can restore ipykernel's writer or publish raw stream messages; the host
    cap must hold on its own (256 MiB in 1 MiB messages: 1 GiB takes a minute under load)."""
    with DockerSandbox(limits=Limits(timeout_s=60, interrupt_grace_s=2), runtime=runtime) as sb:
        assert_next_cell_works(sb)
        with PeakRss() as rss:
            ex = sb.run(
                "k = get_ipython().kernel\ntext = 'y' * (1 << 20)\n"
                "for _ in range(256):\n    k.session.send(k.iopub_socket, 'stream', "
                "{'name': 'stdout', 'text': text}, parent=k.get_parent('shell'))\n"
            )
        assert ex.ok, render(ex)
        assert rss.growth < 64 << 20, rss.growth
        assert len(ex.stdout) <= sb.limits.output_bytes + 200
        assert ex.dropped_bytes >= (256 << 20) - sb.limits.output_bytes - 100, ex.dropped_bytes
        assert_next_cell_works(sb)


@pytest.mark.xdist_group("security-b")
def test_endless_loop_times_out_interrupted_state_kept(runtime, allow_net):
    # a generous grace: on a busy machine the interrupt itself may take a second or two
    limits = Limits(timeout_s=3, interrupt_grace_s=8, allow_net=allow_net)
    with DockerSandbox(limits=limits, runtime=runtime) as sb:
        ok(sb, "x = 41")
        ex = sb.run("while True:\n    pass\n")
        assert ex.timed_out and ex.interrupted and ex.restarted is None, render(ex)
        assert ex.error is not None and ex.error.name == "KeyboardInterrupt"
        assert 3 <= ex.duration_s < 3 + 8
        assert "Timed out" in render(ex)
        after = sb.run("x + 1")
        assert after.ok and after.text == "42", render(after)
        assert_host_unharmed(sb)


@pytest.mark.xdist_group("security-c")
def test_loop_ignoring_sigint_restarts_kernel_keeps_files(runtime, allow_net):
    limits = Limits(timeout_s=3, interrupt_grace_s=2, allow_net=allow_net)
    with DockerSandbox(limits=limits, runtime=runtime) as sb:
        ok(sb, "x = 41\nopen('kept.txt', 'w').write('kept')")
        ex = sb.run(
            "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass\n"
        )
        assert ex.timed_out and ex.restarted == "timeout" and not ex.interrupted, render(ex)
        assert ex.duration_s < 3 + 2 + 20  # deadline + grace + a fresh kernel under load
        assert "restarted" in render(ex)
        assert_a_fresh_kernel_kept_the_files(sb)


@pytest.mark.xdist_group("security-a")
def test_background_process_does_not_outlive_its_timed_out_cell(runtime, allow_net):
    limits = Limits(timeout_s=3, interrupt_grace_s=2, allow_net=allow_net)
    with DockerSandbox(limits=limits, runtime=runtime) as sb:
        ex = sb.run('''
import subprocess, sys, time
child = """
import os, signal, time
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)
n = 0
while True:
    n += 1
    with open('/workspace/counter.tmp', 'w') as f:  # whole or not at all: a kill may land
        f.write(str(n))                                # between a truncate and its write
    os.replace('/workspace/counter.tmp', '/workspace/counter')
    time.sleep(0.05)
"""
subprocess.Popen([sys.executable, "-c", child], start_new_session=True,
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
time.sleep(0.5)
while True:
    pass
''')
        assert ex.timed_out, render(ex)
        time.sleep(0.3)
        first = sb.read("counter")
        assert int(first) > 0
        time.sleep(1.0)
        assert sb.read("counter") == first  # nobody writes it any more
        r = probe(
            sb,
            LIVE_COMMANDS
            + """
import json, os
RELAY = "/opt/venv/bin/python /opt/sandcell/relay.py"  # the supervisor's relay: not the cell's
NET = "/opt/venv/bin/python /opt/sandcell/net_forwarder.py"  # --allow-net's forwarder: neither
mine = os.getpid()
def uid(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("Uid:")).split()[1])
bridge = os.getuid() + 2000  # the stream transport's bridge (and its cat): the host's
others = [cmd for pid, cmd in live_commands()
          if pid not in (1, mine) and not cmd.startswith((RELAY, NET)) and uid(pid) != bridge]
print(json.dumps({"others": others}))
""",
        )
        assert r["others"] == [], r
        assert_host_unharmed(sb)


@pytest.mark.xdist_group("security-a")
def test_the_sweep_of_a_timed_out_cell_spares_the_host_s_helpers(runtime, allow_net):
    """The sweep of a timed-out cell's strays runs after `run` returns: a file read or a check
    the host starts meanwhile (CI saw a read killed) runs in the helpers' group and is left
    alone; the cell's own stray is not."""
    limits = Limits(timeout_s=3, interrupt_grace_s=2, allow_net=allow_net)
    with DockerSandbox(limits=limits, runtime=runtime) as sb:
        helper = "import time; time.sleep(50)  # the host's helper"
        sb.container.exec_run(["python3", "-c", helper], user=ctr.HELPER_USER, detach=True)
        ex = sb.run(
            "import subprocess, sys, time\n"
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(50)  # stray'],"
            " start_new_session=True)\n"
            "while True:\n    pass"
        )
        assert ex.timed_out, render(ex)
        listing = """
import json, time
def alive():
    return [m for _, cmd in live_commands() for m in ("# the host's helper", "# stray") if m in cmd]
deadline = time.monotonic() + 10
while "# stray" in alive() and time.monotonic() < deadline:
    time.sleep(0.1)
print(json.dumps({"alive": sorted(alive())}))
"""
        assert probe(sb, LIVE_COMMANDS + listing)["alive"] == ["# the host's helper"]


@pytest.mark.xdist_group("security-b")
@pytest.mark.timeout(90)
def test_cpu_quota_holds_for_spinning_processes(runtime):
    if runtime == "runsc":
        cpu_quota_from_the_host(runtime)
        return
    limits = Limits(timeout_s=20, interrupt_grace_s=2, cpus=0.5)
    with DockerSandbox(limits=limits, runtime=runtime) as sb:
        r = probe(
            sb,
            """
import json, multiprocessing, os, time
cg = "/sys/fs/cgroup/cpu"
quota = int(open(f"{cg}/cpu.cfs_quota_us").read()); period = int(open(f"{cg}/cpu.cfs_period_us").read())
def usage():
    return int(open("/sys/fs/cgroup/cpuacct/cpuacct.usage").read())
def spin(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
u0, t0 = usage(), time.monotonic()
procs = [multiprocessing.Process(target=spin, args=(3,)) for _ in range(4)]
for p in procs: p.start()
for p in procs: p.join()
used = (usage() - u0) / 1e9; wall = time.monotonic() - t0
print(json.dumps({"quota": quota, "period": period, "cpus": used / wall}))
""",
        )
        assert r["quota"] / r["period"] == pytest.approx(0.5), r
        assert r["cpus"] <= 0.5 * 1.2, r  # 4 spinners would take every core without it
        assert_next_cell_works(sb)


def cpu_quota_from_the_host(runtime: str) -> None:
    """The same bound under gVisor, which shows no cgroup files inside: the quota and the
    CPU time used are read from the container's cgroup on the host."""
    with DockerSandbox(
        limits=Limits(timeout_s=20, interrupt_grace_s=2, cpus=0.5), runtime=runtime
    ) as sb:
        cpu = host_cgroup(sb, "cpu")
        quota = int((cpu / "cpu.cfs_quota_us").read_text())
        period = int((cpu / "cpu.cfs_period_us").read_text())
        usage = host_cgroup(sb, "cpuacct") / "cpuacct.usage"
        u0, t0 = int(usage.read_text()), time.monotonic()
        ok(
            sb,
            "import multiprocessing, time\n"
            "def spin(seconds):\n    end = time.monotonic() + seconds\n"
            "    while time.monotonic() < end:\n        pass\n"
            "procs = [multiprocessing.Process(target=spin, args=(3,)) for _ in range(4)]\n"
            "for p in procs: p.start()\nfor p in procs: p.join()",
        )
        cpus = (int(usage.read_text()) - u0) / 1e9 / (time.monotonic() - t0)
        assert quota / period == pytest.approx(0.5), (quota, period)
        assert cpus <= 0.5 * 1.2, cpus
        assert_next_cell_works(sb)


@pytest.mark.xdist_group("security-d")
@pytest.mark.timeout(120)
def test_kernel_json_cannot_be_swapped_during_a_restart(runtime):
    """While a hard restart unseals the connection directory, model code still running must
    not replace the host's connection file (it would own the next kernel's key). Over the
    stream transport the file is the bridge's, in a folder of its uid's."""
    with DockerSandbox(limits=Limits(timeout_s=3, interrupt_grace_s=1), runtime=runtime) as sb:
        folder = boundary.KEY_DIR if sb.streamed else boundary.CONNECTION_DIR
        original = sb.read(f"{folder}/kernel.json")
        ex = sb.run(
            f"folder = {folder!r}\n"
            """
import json, os, signal
signal.signal(signal.SIGINT, signal.SIG_IGN)
info = json.load(open(f"{folder}/kernel.json"))
info["key"] = "chosen-by-model-code"
data = json.dumps(info)
while True:
    for evil in (f"{folder}/evil.json", "/tmp/evil.json"):
        try:
            with open(evil, "w") as f:
                f.write(data)
            os.replace(evil, f"{folder}/kernel.json")
        except OSError:
            pass
""",
            timeout=3,
        )
        assert ex.restarted == "timeout", render(ex)
        assert sb.read(f"{folder}/kernel.json") == original
        assert json.loads(original)["key"] == sb._info["key"]
        assert_next_cell_works(sb)
        assert_host_unharmed(sb)


@pytest.mark.xdist_group("security-d")
@pytest.mark.timeout(120)
@pytest.mark.parametrize("frames, frame_mb", [(24, 8), (1, 100)], ids=["24x8MiB", "1x100MiB"])
def test_huge_kernel_messages_are_dropped_inside_the_container(frames, frame_mb, runtime):
    """ZMQ holds a whole multipart message in the receiver's memory (MAXMSGSIZE bounds one
    frame, not how many): the relay inside the container receives it and drops it, and the
    rest of the cell's output still arrives."""
    with DockerSandbox(limits=Limits(timeout_s=30, interrupt_grace_s=2), runtime=runtime) as sb:
        assert_next_cell_works(sb)
        with PeakRss() as rss:
            ex = sb.run(
                f"k = get_ipython().kernel\nb = b'y' * ({frame_mb} << 20)\n"
                "k.session.send(k.iopub_socket, 'comm_msg', {'comm_id': 'x', 'data': {}},"
                f" parent=k.get_parent('shell'), buffers=[b] * {frames})\nprint('after')\n"
            )
        assert_next_cell_works(sb)
        assert ex.ok and "after" in ex.stdout, render(ex)
        assert rss.growth < 64 << 20, rss.growth
        assert ex.dropped_bytes >= frames * (frame_mb << 20), ex.dropped_bytes  # the relay said so


FORGE = """
import json, os
me, mine = os.getpid(), os.getuid()
garbage = b"\\x63" * 4096  # no message: any of it reaching the host's reader ends the link
seen, opened = [], []
for pid in os.listdir("/proc"):
    if not pid.isdigit() or int(pid) == me:
        continue
    try:
        with open(f"/proc/{pid}/status") as f:
            uid = int(next(line for line in f if line.startswith("Uid:")).split()[1])
    except (OSError, StopIteration):
        continue
    seen.append(uid)
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        continue
    if uid == mine:
        continue  # the kernel's own uid: reachable by design (the relay bounds what it sends)
    for fd in fds:
        try:
            out = os.open(f"/proc/{pid}/fd/{fd}", os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            os.write(out, garbage)
        except OSError:
            pass
        os.close(out)
        opened.append([pid, uid, fd])
print(json.dumps({"seen": seen, "opened": opened}))
"""


@pytest.mark.xdist_group("security-d")
def test_forged_frames_written_to_every_fd_model_code_reaches_never_reach_the_host(
    runtime, transport
):
    """Over the stream transport the host reads the bridge's output as messages: model code
    writing bytes into every file descriptor it can open (the bridge's and its `cat`'s
    among those it tries, another uid's) reaches none of them, under runc and runsc alike:
    the link goes on, and nothing of another uid was opened."""
    if transport == "ipc":
        pytest.skip("the bridge is the stream transport's")
    with DockerSandbox(limits=FAST, runtime=runtime) as sb:
        link = sb._links[0]
        ex = sb.run(FORGE, timeout=30)
        report = json.loads(ex.stdout.splitlines()[-1]) if ex.ok else render(ex)
        assert ctr.BRIDGE_UID in report["seen"], report  # the bridge was there to attack
        assert report["opened"] == [], report
        assert_next_cell_works(sb)
        assert sb._links == [link] and link.ended is None
