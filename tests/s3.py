"""A real S3-compatible HTTP server for the object-storage tests (moto in server mode, started by
the tests on a free loopback port), and a fresh bucket per test with the credentials and the
endpoint in the environment, as a user's (subprocesses inherit them).
Registered for the whole run in tests/conftest.py."""

from __future__ import annotations

import socket

import pytest


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def s3_server():
    from moto.server import ThreadedMotoServer

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def bucket(s3_server, monkeypatch, request, tmp_path) -> str:
    """``s3://<a bucket named after the test>``, empty; the shard cache in the test's folder."""
    import boto3
    import s3fs

    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL_S3": s3_server,
        "AWS_ENDPOINT_URL": s3_server,
        "PAIRFORGE_CACHE": str(tmp_path / "pairforge-cache"),
    }.items():
        monkeypatch.setenv(key, value)
    name = request.node.name.lower().replace("_", "-")[:50].strip("-")
    boto3.client("s3", endpoint_url=s3_server).create_bucket(Bucket=name)
    s3fs.S3FileSystem.clear_instance_cache()
    return f"s3://{name}"
