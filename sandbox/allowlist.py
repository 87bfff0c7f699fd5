"""Which hosts a sandbox may reach (`--allow-net`), and which addresses it never may.

An entry is `HOST[:PORT]`: a name (`data.example.org`), a subdomain pattern
(`*.example.org`: any name under it, not the name itself) or an IP literal (`[::1]` for IPv6);
without a port, 443 and 80. Names that resolve to loopback, private, link-local (the cloud
metadata address among them), carrier-grade NAT, multicast, reserved or unspecified addresses
are refused unless the entry says `internal:HOST[:PORT]`: the operator means that host inside
the network. Entries come one per option, or as comma lists."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass

DEFAULT_PORTS = (443, 80)
INTERNAL = "internal:"
LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")
CGNAT = ipaddress.ip_network("100.64.0.0/10")
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class HostEntry:
    host: str  # lower case, no trailing dot; "*.example.org" for its subdomains
    ports: tuple[int, ...]
    internal: bool = False

    def matches(self, host: str, port: int) -> bool:
        if port not in self.ports:
            return False
        if self.host.startswith("*."):
            return host.endswith(self.host[1:])
        return host == self.host

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        ports = "" if self.ports == DEFAULT_PORTS else f":{self.ports[0]}"
        return f"{INTERNAL if self.internal else ''}{host}{ports}"


@dataclass(frozen=True)
class Allowlist:
    entries: tuple[HostEntry, ...] = ()

    @classmethod
    def parse(cls, given: Iterable[str]) -> Allowlist:
        """Entries from options or the environment (each may be a comma list); ValueError
        saying which entry is wrong and how to write it."""
        entries: list[HostEntry] = []
        for item in given:
            for text in item.split(","):
                if text.strip():
                    entries.append(_entry(text.strip()))
        return cls(tuple(dict.fromkeys(entries)))

    def __bool__(self) -> bool:
        return bool(self.entries)

    def __str__(self) -> str:
        return ", ".join(str(entry) for entry in self.entries) or "nothing"

    def entry_for(self, host: str, port: int) -> HostEntry | None:
        host = normal(host)
        return next((e for e in self.entries if e.matches(host, port)), None)

    def narrowed(self, to: Allowlist) -> Allowlist:
        """Only the entries of `to` that this list allows too (a user's narrowing in the
        users file: it can take hosts away, never add one)."""
        kept = [
            e for e in to.entries
            if all(self._covers(e, port) for port in e.ports)
        ]  # fmt: skip
        return Allowlist(tuple(kept))

    def _covers(self, entry: HostEntry, port: int) -> bool:
        for mine in self.entries:
            if port not in mine.ports or entry.internal and not mine.internal:
                continue
            if mine.host == entry.host or (
                mine.host.startswith("*.") and entry.host.endswith(mine.host[1:])
            ):
                return True
        return False


def normal(host: str) -> str:
    return host.strip().lower().rstrip(".")


def valid_host(host: str) -> bool:
    """An IP address, or a name of ASCII letters, digits and hyphens in dot-separated labels
    (253 characters at most)."""
    if is_address(host):
        return True
    return len(host) <= 253 and all(LABEL.fullmatch(label) for label in host.split("."))


def _entry(text: str) -> HostEntry:
    internal = text.lower().startswith(INTERNAL)
    rest = text[len(INTERNAL) :] if internal else text
    host, port = _split(rest, text)
    if host.startswith("*."):
        if not all(LABEL.fullmatch(label) for label in host[2:].split(".")) or "." not in host[2:]:
            raise ValueError(_wrong(text, "a pattern is *. and a domain of two labels or more"))
    elif not is_address(host) and not all(LABEL.fullmatch(label) for label in host.split(".")):
        raise ValueError(_wrong(text, "not a host name, a *.domain pattern or an IP address"))
    return HostEntry(host, (port,) if port else DEFAULT_PORTS, internal)


def _split(rest: str, text: str) -> tuple[str, int | None]:
    if rest.startswith("["):  # [IPv6]:port
        host, _, after = rest[1:].partition("]")
        port_text = after.removeprefix(":") if after.startswith(":") else after
    elif rest.count(":") == 1:
        host, port_text = rest.split(":")
    else:
        host, port_text = rest, ""
    if port_text and not (port_text.isdigit() and 0 < int(port_text) < 65536):
        raise ValueError(_wrong(text, f"the port {port_text!r} is not a number from 1 to 65535"))
    return normal(host), int(port_text) if port_text else None


def is_address(host: str) -> bool:
    """Whether `host` is an IP address written out (not a name)."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _wrong(text: str, why: str) -> str:
    return (
        f"--allow-net {text!r}: {why}; write HOST[:PORT] (data.example.org, "
        "*.example.org:8443), or internal:HOST[:PORT] for a host inside your network"
    )


def refused_address(address: Address) -> str | None:
    """Why a sandbox may not reach this address without an internal: entry, or None."""
    if isinstance(address, ipaddress.IPv6Address):
        inner = address.ipv4_mapped or address.sixtofour or (address.teredo or (None, None))[1]
        if inner is not None:  # an IPv4 address inside: judged as itself
            return refused_address(inner)
        if address.is_site_local:
            return "a site-local address"
    checks = (
        (address.is_loopback, "a loopback address"),
        (address.is_unspecified, "an unspecified address"),
        (address.is_link_local, "a link-local address (the cloud metadata service's among them)"),
        (address.is_multicast, "a multicast address"),
        (isinstance(address, ipaddress.IPv4Address) and address in CGNAT, "a carrier-grade NAT address"),
        (address.is_reserved, "a reserved address"),
        (address.is_private, "a private address"),
        (not address.is_global, "a reserved address"),
    )  # fmt: skip
    return next((why for bad, why in checks if bad), None)
