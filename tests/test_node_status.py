"""Operating a node: its bearer token (``walsvc serve --token-file``) and the typed
refusals a client gets. A node in a subprocess, clients over real sockets.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from _node_process import node_process

import walsvc
from walsvc import Message
from walsvc.apps._cli import main

TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def token_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("token") / "token"
    path.write_text(TOKEN + "\n")
    return path


@pytest.fixture(scope="module")
def node(token_file: Path) -> Iterator[str]:
    """A node on memory:// demanding the token of ``token_file``; yields its URL."""
    url = f"memory://status-{uuid.uuid4().hex[:8]}"
    with node_process(url, "--token-file", str(token_file), env={"WALSVC_TOKEN": ""}) as (
        node_url,
        _,
    ):
        yield node_url


def _pchannel() -> str:
    return f"p-{uuid.uuid4().hex[:10]}"


async def test_the_token_of_a_file_is_demanded_and_refusals_are_typed(node: str) -> None:
    for token in (None, "wrong"):
        with pytest.raises(walsvc.Unauthenticated, match="refused the connection"):
            await walsvc.open_wal(node, _pchannel(), token=token)
    with pytest.raises(walsvc.UnsupportedVersion, match=r"versions 1\.\.1.*speaks 7\.\.9"):
        await walsvc.open_wal(node, _pchannel(), token=TOKEN, versions=(7, 9))
    assert issubclass(walsvc.Unauthenticated, walsvc.WALError)
    assert not walsvc.Unauthenticated.retriable
    async with await walsvc.open_wal(node, _pchannel(), token=TOKEN) as wal:
        assert (await wal.append(Message(payload=b"x", vchannel="v"))).timetick > 0


@pytest.mark.parametrize("content", [None, "", "\n  \n"])
def test_a_token_file_that_is_missing_or_empty_is_a_usage_error(
    content: str | None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "token"
    if content is not None:
        path.write_text(content)
    argv = ["serve", "--url", "memory://t", "--listen", "127.0.0.1:0", "--token-file", str(path)]
    assert main(argv) == 2
    assert "error: --token-file" in capsys.readouterr().err
