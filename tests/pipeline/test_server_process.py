"""`free_port` when servers start side by side (serve_check's launch commands run concurrently)."""

from __future__ import annotations

import socket
from concurrent.futures import ThreadPoolExecutor

from pipeline import server_process


class _SamePortSocket(socket.socket):
    """A socket whose bind(("127.0.0.1", 0)) always lands on one port at first, as a kernel may reoffer a
    released port."""

    offers: list[int] = []

    def getsockname(self):
        host, port = super().getsockname()
        return host, (self.offers.pop(0) if self.offers else port)


def test_a_port_is_never_handed_out_twice(monkeypatch):
    first = server_process.free_port()
    _SamePortSocket.offers = [first, first]  # the kernel offers the port already given twice more
    monkeypatch.setattr(server_process.socket, "socket", _SamePortSocket)
    second = server_process.free_port()
    assert second != first and not _SamePortSocket.offers


def test_concurrent_callers_get_distinct_ports():
    with ThreadPoolExecutor(max_workers=8) as pool:
        ports = list(pool.map(lambda _: server_process.free_port(), range(64)))
    assert len(set(ports)) == len(ports)
