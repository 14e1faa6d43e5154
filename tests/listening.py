"""Which local addresses a TCP port listens on, read from the kernel's socket tables (Linux /proc/net)."""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
from pathlib import Path


def _address(hex_addr: str, family: int) -> str:
    raw = bytes.fromhex(hex_addr)
    if family == socket.AF_INET:
        return str(ipaddress.IPv4Address(struct.pack("<I", struct.unpack(">I", raw)[0])))
    words = struct.unpack("<4I", struct.pack(">4I", *struct.unpack(">4I", raw)))  # each 32-bit word little-endian
    return str(ipaddress.IPv6Address(b"".join(struct.pack(">I", w) for w in words)))


def listening() -> dict[int, tuple[str, int]]:
    """Every listening TCP socket (IPv4 and IPv6) of this machine's network namespace: inode -> (address, port)."""
    found = {}
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        path = Path("/proc/net") / table
        if not path.is_file():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            addr, port = fields[1].rsplit(":", 1)
            if fields[3] == "0A":  # LISTEN
                found[int(fields[9])] = (_address(addr, family), int(port, 16))
    return found


def listen_addresses(port: int) -> set[str]:
    """The addresses on which something listens on ``port``."""
    return {a for a, p in listening().values() if p == port}


def socket_owners(inodes: set[int]) -> dict[int, int]:
    """inode -> pid of a process holding that socket (the processes this user may look into)."""
    owners = {}
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        try:
            for fd in fd_dir.iterdir():
                link = os.readlink(fd)
                if link.startswith("socket:[") and int(link[8:-1]) in inodes:
                    owners[int(link[8:-1])] = int(fd_dir.parent.name)
        except OSError:  # gone, or not ours to read
            continue
    return owners

