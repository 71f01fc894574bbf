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


HEALTH_SERVER = """
import http.server, sys
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
"""


def test_a_block_unwinding_stops_the_servers_its_threads_drive(tmp_path):
    """Ctrl-C while another thread drives a server: the server is stopped at once, so the thread (blocked on it)
    returns and the pool does not wait for a server nobody reads any more."""
    import subprocess
    import sys
    import threading
    import time

    import pytest

    script = tmp_path / "health.py"
    script.write_text(HEALTH_SERVER)
    up, stopped = threading.Event(), threading.Event()
    servers: list[subprocess.Popen] = []

    def drive() -> None:
        port = server_process.free_port()
        with server_process.running_server([sys.executable, str(script), str(port)], port, tmp_path / "s.log", 30,
                                           "test.timeout") as server:
            servers.append(server)
            up.set()
            server.wait(timeout=60)  # a client blocked on the server, as launch_check's requests are
        stopped.set()

    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        with ThreadPoolExecutor(max_workers=1) as pool, server_process.servers_stopped_on_error():
            pool.submit(drive)
            assert up.wait(timeout=30)
            raise KeyboardInterrupt
    assert stopped.is_set() and servers[0].poll() is not None
    assert time.monotonic() - started < 30  # the server would have kept the thread 60 s
