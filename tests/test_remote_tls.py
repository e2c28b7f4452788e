"""TLS between walsvc:// clients and a node (``walsvc serve --tls-cert/--tls-key``, and
``--tls-client-ca`` for client certificates; ``walsvc status --tls-ca``): a node in a
subprocess, certificates made by the ``openssl`` command for a throwaway CA."""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from _node_process import node_process

import walsvc
from walsvc import DeliverPolicy, Message
from walsvc.apps._cli import main


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _signed(name: str, cn: str, cwd: Path) -> None:
    """``name.key`` and ``name.crt`` for ``cn``, signed by ``ca``, valid for 127.0.0.1."""
    _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", f"{name}.key", cwd=cwd)
    _openssl(
        "req", "-new", "-key", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={cn}", cwd=cwd
    )
    (cwd / f"{name}.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext",
        cwd=cwd,
    )  # fmt: skip


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA, a server certificate for 127.0.0.1 and a client certificate."""
    assert shutil.which("openssl"), "the TLS tests make their certificates with openssl"
    where = tmp_path_factory.mktemp("tls")
    _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "ca.key", cwd=where)
    _openssl(
        "req", "-x509", "-new", "-key", "ca.key", "-out", "ca.crt", "-days", "2",
        "-subj", "/CN=walsvc test CA", cwd=where,
    )  # fmt: skip
    _signed("server", "127.0.0.1", where)
    _signed("client", "walsvc-client", where)
    return where


@pytest.fixture(scope="module")
def tls_node(certs: Path) -> Iterator[str]:
    """A node over TLS that demands client certificates from the test CA."""
    tls = ("--tls-cert", str(certs / "server.crt"), "--tls-key", str(certs / "server.key"))
    url = f"memory://tls-{uuid.uuid4().hex[:8]}"
    with node_process(url, *tls, "--tls-client-ca", str(certs / "ca.crt")) as (node_url, _):
        yield node_url


def _client_context(certs: Path, *, trust: bool = True, cert: bool = True) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(certs / "ca.crt") if trust else None)
    if cert:
        context.load_cert_chain(str(certs / "client.crt"), str(certs / "client.key"))
    return context


async def test_appends_and_reads_over_tls(tls_node: str, certs: Path) -> None:
    tls = _client_context(certs)
    async with await walsvc.open_wal(tls_node, "p0", tls=tls) as wal:
        sent = await wal.append(Message(payload=b"secret", vchannel="v1"))
        async with wal.read(DeliverPolicy.start_from(sent.message_id)) as scanner:
            got = await anext(scanner)
    assert (got.payload, got.message_id) == (b"secret", sent.message_id)


async def test_a_client_without_tls_is_refused_and_the_node_serves_on(
    tls_node: str, certs: Path
) -> None:
    with pytest.raises(walsvc.BackendUnavailable, match="does it require TLS"):
        await walsvc.open_wal(tls_node, "p0", connect_timeout=5)
    async with await walsvc.open_wal(tls_node, "p0", tls=_client_context(certs)) as wal:
        await wal.append(Message(payload=b"after", vchannel="v1"))


async def test_a_node_certificate_the_client_does_not_trust_is_refused(
    tls_node: str, certs: Path
) -> None:
    untrusting = _client_context(certs, trust=False)
    with pytest.raises(walsvc.WALError, match="does not verify"):
        await walsvc.open_wal(tls_node, "p0", tls=untrusting, connect_timeout=5)


async def test_a_client_without_a_certificate_is_refused_when_the_node_demands_one(
    tls_node: str, certs: Path
) -> None:
    """The TLS handshake itself succeeds on the client's side (TLS 1.3 sends the
    certificate request after it); the node then drops the connection."""
    no_cert = _client_context(certs, cert=False)
    with pytest.raises(walsvc.BackendUnavailable):
        await walsvc.open_wal(tls_node, "p0", tls=no_cert, connect_timeout=5)


def test_tls_flags_are_checked(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "walsvc", "serve", "--url", f"file://{tmp_path}", "--tls-key", "k"],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert done.returncode == 2
    assert "--tls-key and --tls-client-ca need --tls-cert" in done.stderr


def test_walsvc_status_speaks_tls(
    tls_node: str, certs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    client = ("--tls-cert", str(certs / "client.crt"), "--tls-key", str(certs / "client.key"))
    assert main(["status", tls_node, "--json", "--tls-ca", str(certs / "ca.crt"), *client]) == 0
    assert f"walsvc://{json.loads(capsys.readouterr().out)['listen']}" == tls_node
    assert main(["status", tls_node, "--timeout", "5"]) == 2
    assert "does it require TLS" in capsys.readouterr().err
    assert main(["status", tls_node, "--tls-key", "k"]) == 2
    assert "--tls-key needs --tls-cert" in capsys.readouterr().err
