"""A real S3 HTTP server for the tests and the bench: moto's server as its own process on a free
loopback port (moto is a test dependency; nothing of the fleet imports this).

moto keeps its buckets in the process's memory, so an outage is made by
freezing the process (SIGSTOP: connections are accepted by the kernel and never
answered, as a hung store's are) and thawing it (SIGCONT), which keeps every
object. `env` is what a worker or a producer command needs to reach it: the
standard AWS variables only, with config files pointed away so a developer's
own ~/.aws never joins in. `auth=True` starts one that checks signatures
(moto's IAM), where the dummy key is refused as an unknown access key id.
"""
from __future__ import annotations

import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

import boto3
import httpx

from producer.local import Process, free_port, spawn, wait_for

BUCKET = "traces"


@dataclass
class S3Server:
    process: Process
    url: str
    env: dict[str, str]

    def client(self):
        return boto3.client("s3", endpoint_url=self.url, region_name="us-east-1",
                            aws_access_key_id=self.env["AWS_ACCESS_KEY_ID"],
                            aws_secret_access_key=self.env["AWS_SECRET_ACCESS_KEY"])

    def keys(self, prefix: str = "") -> list[str]:
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
        return sorted(item["Key"] for page in pages for item in page.get("Contents", ()))

    def freeze(self) -> None:
        self.process.signal(signal.SIGSTOP)

    def thaw(self) -> None:
        self.process.signal(signal.SIGCONT)

    def stop(self) -> None:
        self.thaw()
        self.process.stop(timeout=10)


def start_s3(logs: Path, auth: bool = False) -> S3Server:
    port = free_port()
    env = {"INITIAL_NO_AUTH_ACTION_COUNT": "0"} if auth else {}
    process = spawn(f"moto-{port}", [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                    logs, env={**os.environ, **env})
    url = f"http://127.0.0.1:{port}"
    aws = {"AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": "fleet-test-key", "AWS_SECRET_ACCESS_KEY": "fleet-test-secret",
           "AWS_REGION": "us-east-1", "AWS_CONFIG_FILE": "/nonexistent", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
           "AWS_EC2_METADATA_DISABLED": "true"}
    server = S3Server(process, url, aws)
    try:
        wait_for(lambda: httpx.get(f"{url}/moto-api/data.json", timeout=2).status_code == 200, 60,
                 f"S3 server on port {port}", process)
        if not auth:
            server.client().create_bucket(Bucket=BUCKET)
    except BaseException:
        server.stop()
        raise
    return server
