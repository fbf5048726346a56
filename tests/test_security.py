"""Transport security of the job service against the real controller process: TLS with a test
CA made here (openssl), tokens from a file or the environment, plaintext TCP refused unless asked
for, and no token visible in the bytes on the wire."""

import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from inagg.controller.cli import ctl_main
from inagg.hostlib.jobservice.client import ControllerClient, ControllerError

ROOT = Path(__file__).resolve().parents[1]
ADMIN = "admin-secret-7f3e9c"

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI")


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_ca(d: Path, name: str) -> None:
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "1", "-subj", f"/CN={name}", cwd=d)


def make_server_cert(d: Path, ca: str, ip: str) -> None:
    (d / "san.cnf").write_text(f"subjectAltName=IP:{ip}\n")
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", "ctl.key", "-out", "ctl.csr", "-subj", f"/CN={ip}", cwd=d)
    openssl("x509", "-req", "-in", "ctl.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
            "-CAcreateserial", "-out", "ctl.pem", "-days", "1", "-extfile", "san.cnf", cwd=d)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_controller(d: Path, config: str, *args: str) -> subprocess.Popen:
    (d / "config.json").write_text(config)
    return subprocess.Popen([sys.executable, "-m", "inagg.controller", "--config", str(d / "config.json"), *args],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


class Recorder:
    """A TCP relay that keeps every byte it passes (the wire as an eavesdropper sees it)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.seen = bytearray()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                self.seen += data
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


@pytest.fixture
def tls_controller(tmp_path):
    make_ca(tmp_path, "ca")
    make_ca(tmp_path, "other-ca")
    make_server_cert(tmp_path, "ca", "127.0.0.1")
    (tmp_path / "admin.token").write_text(ADMIN + "\n")
    port = free_port()
    proc = start_controller(tmp_path, f'''{{
        "listen": "127.0.0.1:{port}", "tls_cert": "ctl.pem", "tls_key": "ctl.key",
        "admin_token_file": "admin.token", "database": "ctl.sqlite",
        "host_aggregator": "127.0.0.1:42666", "switches": []}}''')
    assert "serving" in proc.stdout.readline(), proc.stderr.read()
    yield tmp_path, port
    proc.terminate()
    proc.wait(10)


def test_tls_round_trip_with_a_test_ca_and_no_token_on_the_wire(tls_controller):
    d, port = tls_controller
    relay = Recorder(("127.0.0.1", port))
    client = ControllerClient(f"127.0.0.1:{relay.port}", ca=d / "ca.pem")
    try:
        job_id, token = client.create_job(2, name="tenant")
        client.join(job_id, token, 0, "127.0.0.1:5000")
        listed = client.list_jobs(ADMIN)
        assert [j.job_id for j in listed.jobs] == [job_id]
        with pytest.raises(ControllerError, match="PERMISSION_DENIED"):
            client.list_jobs("wrong")
    finally:
        client.close()
    assert relay.seen                                          # traffic went through the relay...
    for secret in (ADMIN, token, "tenant"):                    # ...and none of it is readable
        assert secret.encode() not in relay.seen


def test_clients_refuse_plaintext_tcp_and_a_certificate_from_another_ca(tls_controller):
    d, port = tls_controller
    with pytest.raises(ControllerError, match="TCP needs TLS"):
        ControllerClient(f"127.0.0.1:{port}")
    other = ControllerClient(f"127.0.0.1:{port}", timeout=3, ca=d / "other-ca.pem")
    with pytest.raises(ControllerError, match="unreachable"):
        other.create_job(2)
    other.close()
    plain = ControllerClient(f"127.0.0.1:{port}", timeout=3, insecure=True)   # asked for, but the server speaks TLS
    with pytest.raises(ControllerError, match="unreachable"):
        plain.create_job(2)
    plain.close()


def test_inaggctl_reads_the_admin_token_from_a_file_or_the_environment(tls_controller, capsys, monkeypatch):
    d, port = tls_controller
    common = ["--controller", f"127.0.0.1:{port}", "--controller-ca", str(d / "ca.pem")]
    assert ctl_main([*common, "--admin-token-file", str(d / "admin.token"), "jobs"]) == 0
    monkeypatch.setenv("INAGG_ADMIN_TOKEN", ADMIN)
    assert ctl_main([*common, "slots"]) == 0
    monkeypatch.delenv("INAGG_ADMIN_TOKEN")
    assert ctl_main([*common, "jobs"]) == 2
    assert "no admin token" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        ctl_main([*common, "--admin-token", ADMIN, "jobs"])        # argv is no place for a token


def test_the_controller_refuses_plaintext_tcp_unless_asked(tmp_path):
    config = f'''{{"listen": "127.0.0.1:{free_port()}", "admin_token_file": "t", "database": "c.sqlite",
                  "host_aggregator": "127.0.0.1:42666", "switches": []}}'''
    (tmp_path / "t").write_text(ADMIN)
    proc = start_controller(tmp_path, config)
    out, err = proc.communicate(timeout=120)   # imports alone take seconds on a loaded CI
    assert proc.returncode == 2 and "refusing to serve job tokens in plaintext" in err
    proc = start_controller(tmp_path, config, "--insecure")   # explicitly asked for
    try:
        assert "serving" in proc.stdout.readline()
        client = ControllerClient(config.split('"')[3], insecure=True)
        assert client.create_job(1)[0] >= 1
        client.close()
    finally:
        proc.terminate()
        proc.wait(10)
