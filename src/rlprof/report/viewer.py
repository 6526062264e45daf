"""`rlprof view`: serve a run's report and its raw trace files over HTTP, on loopback by default.

Only files inside the run directory are served; anything that resolves outside it (`..`, symlinks,
encoded dots) is refused with 403.
"""

from __future__ import annotations

import html
import socket
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

TRACE_SUFFIXES = (".json", ".json.gz", ".pickle", ".jsonl", ".csv", ".duckdb", ".html")


class Handler(BaseHTTPRequestHandler):
    server_version = "rlprof-view"

    def __init__(self, *args, root: Path, report: Path, **kwargs):
        self.root, self.report = root, report
        super().__init__(*args, **kwargs)

    def log_message(self, fmt, *args):  # quiet: one line per request is noise for a local viewer
        pass

    def do_GET(self):
        path = unquote(urlsplit(self.path).path)
        if path in ("/", "/report.html"):
            return self._send_file(self.report, "text/html; charset=utf-8")
        if path in ("/files", "/files/"):
            return self._send_listing()
        if path.startswith("/files/"):
            target = (self.root / path[len("/files/") :]).resolve()
            if not target.is_relative_to(self.root):
                return self._error(403, "outside the run directory")
            if not target.is_file():
                return self._error(404, "no such file")
            return self._send_file(target, "application/octet-stream", download=True)
        return self._error(404, "not found; try / (report) or /files/ (traces)")

    def _send_file(self, path: Path, ctype: str, download: bool = False):
        size = path.stat().st_size
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(size))
        if download:
            self.send_header("Content-Disposition", f'attachment; filename="{quote(path.name)}"')
        self.end_headers()
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                self.wfile.write(chunk)

    def _send_listing(self):
        files = sorted(p for p in self.root.rglob("*") if p.is_file() and p.name.endswith(TRACE_SUFFIXES))
        items = "".join(
            f'<li><a href="/files/{quote(str(p.relative_to(self.root)))}">'
            f"{html.escape(str(p.relative_to(self.root)))}</a> ({p.stat().st_size / 1e6:.2f} MB)</li>"
            for p in files
        )
        body = (
            f"<!DOCTYPE html><meta charset=utf-8><title>rlprof files</title><h1>{html.escape(self.root.name)}"
            f'</h1><p><a href="/">report</a></p><ul>{items}</ul>'
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, code: int, why: str):
        body = why.encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def make_server(run_dir: Path, report: Path, host: str = "127.0.0.1", port: int = 8765) -> ThreadingHTTPServer:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    server_cls = type("Server", (ThreadingHTTPServer,), {"address_family": family, "daemon_threads": True})
    return server_cls((host, port), partial(Handler, root=run_dir.resolve(), report=report.resolve()))


def tunnel_hint(host: str, port: int) -> str:
    local = socket.gethostname()
    if host in ("127.0.0.1", "::1", "localhost"):
        return f"from a laptop: ssh -N -L {port}:127.0.0.1:{port} <you>@{local}  then open http://127.0.0.1:{port}/"
    return f"listening on {host}: anyone who can reach {local}:{port} can read these traces"
