"""``treadle dev --ssl-certfile F --ssl-keyfile K`` serves the API and console over https."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx

from tests.acceptance.conftest import ROOT, free_port
from tests.helpers import wait_for_sync, wait_until_serving
from tests.support.tls import self_signed


def test_dev_serves_https_with_the_given_certificate(tmp_path: Path) -> None:
    cert = self_signed(tmp_path / "tls", ["localhost"], ["127.0.0.1"])
    port = free_port()
    url = f"https://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TREADLE_")}
    env["TREADLE_DATA_DIR"] = str(tmp_path / "data")
    log = tmp_path / "dev.log"
    args = ["dev", "--port", str(port), "--ssl-certfile", str(cert.certfile)]
    with log.open("w") as out:
        dev = subprocess.Popen(
            [sys.executable, "-m", "app.cli.main", *args, "--ssl-keyfile", str(cert.keyfile)],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for_sync(
            lambda: f"console: {url}/ui/" in log.read_text() or dev.poll() is not None,
            timeout=90,
            what="treadle dev's banner",
        )
        assert f"console: {url}/ui/" in log.read_text(), log.read_text()
        wait_until_serving(url, dev, log, timeout=90, verify=cert.client_context())
        with httpx.Client(base_url=url, verify=cert.client_context(), timeout=30) as c:
            login = c.get("/ui/login")
            assert login.status_code == 200
            assert any(
                h.startswith("__Host-treadle_console_login=") and "Secure" in h
                for h in login.headers.get_list("set-cookie")
            ), login.headers.get_list("set-cookie")
    finally:
        dev.terminate()
        try:
            dev.wait(timeout=30)
        except subprocess.TimeoutExpired:
            dev.kill()
            dev.wait()


def test_a_key_without_its_certificate_stops_dev_with_one_line(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TREADLE_")}
    env["TREADLE_DATA_DIR"] = str(tmp_path / "data")
    done = subprocess.run(
        [sys.executable, "-m", "app.cli.main", "dev", "--ssl-keyfile", __file__],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "TREADLE_SSL_CERTFILE and TREADLE_SSL_KEYFILE go together" in done.stderr + done.stdout
