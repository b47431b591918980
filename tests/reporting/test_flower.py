"""Flower (`celery -A workers flower`) beside real workers: dashboard, metrics, task arguments, security."""
from __future__ import annotations

import re
import secrets
import socket
import sys
from pathlib import Path

import httpx
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from producer.local import Process, free_port, redis_server_binary, spawn, wait_for

from conftest import Fleet, messages_of, render, varied_prompts, write_prompts

ARGSREPR = re.compile(r"^\(run='default', id='(p-\d{4})', prompt_tokens=(\d+)\)$")
REFUSAL = "Refusing to start Flower"
HOST = socket.gethostname()


def start_flower(fleet: Fleet, *options: str, address: str | None = "127.0.0.1", wait: bool = True,
                 **env: str) -> tuple[Process, str]:
    """`celery -A workers flower` with the fleet's environment (and no FLOWER_* from ours)."""
    port = free_port()
    argv = [sys.executable, "-m", "celery", "-A", "workers", "flower", f"--port={port}", *options]
    if address is not None:
        argv.append(f"--address={address}")
    full_env = {k: v for k, v in fleet.env(**env).items() if not k.startswith("FLOWER_") or k in env}
    process = spawn(f"flower-{port}", argv, fleet.logs, env=full_env)
    fleet.processes.append(process)
    url = f"http://127.0.0.1:{port}"
    if wait:
        wait_for(lambda: httpx.get(f"{url}/healthcheck", timeout=5).text == "OK", 60, "flower", process)
    return process, url


def metrics(url: str) -> dict[tuple[str, frozenset], float]:
    """Flower's /metrics as {(sample name, labels): value}."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def worker_online(url: str, worker: str) -> bool:
    return metrics(url).get(("flower_worker_online", frozenset({("worker", worker)}))) == 1


def succeeded(url: str, worker: str) -> float:
    key = ("flower_events_total",
           frozenset({("worker", worker), ("type", "task-succeeded"), ("task", "fleet.generate")}))
    return metrics(url).get(key, 0)


def fleet_with_flower(fleet: Fleet, tmp_path: Path, n: int, *flower_options: str, standin: tuple = (),
                      **flower_env: str):
    """Given a stand-in, worker w1 and Flower seeing it online, when n prompts are generated
    (all stored, unless the stand-in's options inject faults)."""
    _, server = fleet.standin(*standin)
    fleet.worker("w1", [server])
    _, url = start_flower(fleet, *flower_options, **flower_env)
    worker = f"w1@{HOST}"
    wait_for(lambda: worker_online(url, worker), 60, "flower seeing w1 online")
    records = varied_prompts(n)
    fleet.producer("enqueue", str(write_prompts(tmp_path / "prompts.jsonl", records)))
    states = fleet.wait_finished()
    assert states == {"done": n} or (standin and sum(states.values()) == n)
    return url, worker, records


def test_the_dashboard_in_a_browser_lists_the_worker_and_its_succeeded_tasks(fleet, tmp_path, browser):
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    # Given a worker, Flower beside it, and 6 prompts generated while Flower watched
    url, worker, records = fleet_with_flower(fleet, tmp_path, 6)
    wait_for(lambda: succeeded(url, worker) == 6, 30, "flower counting 6 succeeded tasks")

    # When the dashboard is opened in headless Chromium and its scripts have rendered
    browser.get(url + "/")
    # (the page redraws its tables as events arrive, so an element read mid-redraw is stale: read again)
    wait = WebDriverWait(browser, 30, ignored_exceptions=(StaleElementReferenceException,))
    wait.until(lambda d: worker in d.find_element(By.ID, "workers-table").text)
    wait.until(lambda d: d.find_element(By.ID, "workers-succeeded").text.strip() == "6")

    # Then it lists the worker, online, with its 6 succeeded tasks
    wait.until(lambda d: d.find_element(By.ID, "workers-online").text.strip() == "1")
    row = f"//table[@id='workers-table']//tr[td[contains(., '{worker}')]]"
    wait.until(lambda d: "6" in d.find_element(By.XPATH, row).text.split())

    # And the tasks page lists every prompt's task as succeeded
    browser.get(url + "/tasks")
    wait.until(lambda d: d.find_element(By.ID, "tasks-table").text.count("SUCCESS") == 6)
    table = wait.until(lambda d: d.find_element(By.ID, "tasks-table").text)
    for record in records:
        assert f"default:{record['id']}" in table


def failed(url: str, worker: str) -> float:
    key = ("flower_events_total",
           frozenset({("worker", worker), ("type", "task-failed"), ("task", "fleet.generate")}))
    return metrics(url).get(key, 0)


def test_a_dead_lettered_prompt_shows_in_flower_as_a_failed_task_naming_its_reason(fleet, tmp_path, browser):
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    # Given Flower watching a worker whose server leaves a share of its answers without think-end
    url, worker, records = fleet_with_flower(fleet, tmp_path, 12, standin=("--fault-missing-think-end", "0.4"))
    dead = {d["id"]: d for d in fleet.dead_letters()}
    assert dead and len(dead) < len(records)

    # When Flower has counted the tasks' events
    wait_for(lambda: failed(url, worker) == len(dead) and succeeded(url, worker) == len(records) - len(dead),
             30, "flower counting failed and succeeded tasks")

    # Then each dead letter is a failed task (Flower's metrics and its tasks page agree) ...
    browser.get(url + "/tasks")
    wait = WebDriverWait(browser, 30, ignored_exceptions=(StaleElementReferenceException,))
    wait.until(lambda d: d.find_element(By.ID, "tasks-table").text.count("FAILURE") == len(dead))
    assert wait.until(lambda d: d.find_element(By.ID, "tasks-table").text).count("SUCCESS") == len(records) - len(dead)
    # ... whose exception names the reason code and the dead letter's message
    some_id, letter = next(iter(dead.items()))
    browser.get(f"{url}/task/default:{some_id}")
    wait.until(lambda d: "FAILURE" in d.find_element(By.TAG_NAME, "body").text)
    page = browser.find_element(By.TAG_NAME, "body").text
    assert "DeadLettered" in page and f"{letter['reason']}: {letter['message'][:40]}" in page


def test_metrics_show_the_worker_online_and_its_succeeded_tasks(fleet, tmp_path):
    # Given a worker, Flower beside it, and 5 prompts generated while Flower watched
    url, worker, _ = fleet_with_flower(fleet, tmp_path, 5)

    # When Prometheus scrapes /metrics (no credentials: Flower exempts it from auth)
    wait_for(lambda: succeeded(url, worker) == 5, 30, "flower counting 5 succeeded tasks")
    scraped = metrics(url)

    # Then the worker is online and its succeeded, received and started tasks are counted
    assert scraped[("flower_worker_online", frozenset({("worker", worker)}))] == 1
    for event in ("task-received", "task-started", "task-succeeded"):
        key = ("flower_events_total", frozenset({("worker", worker), ("type", event), ("task", "fleet.generate")}))
        assert scraped[key] == 5, event


def test_task_arguments_show_the_prompt_id_and_size_not_token_ids(fleet, tmp_path, tokenizer):
    # Given Flower (basic auth) and 4 prompts generated while it watched
    auth = ("admin", "pw-" + secrets.token_hex(8))
    url, _, records = fleet_with_flower(fleet, tmp_path, 4, FLOWER_BASIC_AUTH=":".join(auth))
    # (a worker sends its task events in batches, FLEET_TASK_EVENTS_INTERVAL: the last may trail the samples stored)
    wait_for(lambda: [t["state"] for t in httpx.get(f"{url}/api/tasks", auth=auth, timeout=10).json().values()]
             == ["SUCCESS"] * 4, 30, "4 tasks succeeded in flower")

    # When its API lists the tasks
    tasks = httpx.get(f"{url}/api/tasks", auth=auth, timeout=10).json()

    # Then each shows the run, the prompt id and its exact size as arguments, never token ids
    sizes = {r["id"]: len(render(tokenizer, messages_of(r))) for r in records}
    shown = {}
    for task in tasks.values():
        assert task["state"] == "SUCCESS"
        match = ARGSREPR.match(task["args"])
        assert match, task["args"]
        shown[match[1]] = int(match[2])
        assert task["kwargs"] in ("", "{}", None)
    assert shown == sizes
    # and so does the task's page
    page = httpx.get(f"{url}/task/default:{records[0]['id']}", auth=auth, timeout=10).text
    assert f"prompt_tokens={sizes[records[0]['id']]}" in page
    assert not re.search(r"\d+, \d+, \d+, \d+", page)


def test_tasks_published_before_any_worker_runs_show_as_sent(fleet, tmp_path, tokenizer):
    # Given Flower (basic auth, which its API needs) watching a fleet with no worker yet
    auth = ("admin", "pw-" + secrets.token_hex(8))
    _, url = start_flower(fleet, FLOWER_BASIC_AUTH=":".join(auth))
    records = varied_prompts(300)

    # When the producer publishes 300 prompts (their task-sent events go out one message a batch)
    fleet.producer("enqueue", str(write_prompts(tmp_path / "prompts.jsonl", records)))

    # Then Flower lists every task as sent (PENDING), with its prompt id and size as arguments
    wait_for(lambda: len(httpx.get(f"{url}/api/tasks", auth=auth, timeout=10).json()) == 300, 30,
             "300 tasks in flower")
    tasks = httpx.get(f"{url}/api/tasks", auth=auth, timeout=10).json()
    assert {task["state"] for task in tasks.values()} == {"PENDING"}
    sizes = {r["id"]: len(render(tokenizer, messages_of(r))) for r in records}
    shown = {m[1]: int(m[2]) for m in (ARGSREPR.match(t["args"]) for t in tasks.values()) if m}
    assert shown == sizes
    assert set(tasks) == {f"default:{r['id']}" for r in records}


@pytest.mark.parametrize("how", [
    pytest.param({"address": "0.0.0.0"}, id="--address=0.0.0.0"),
    pytest.param({"address": None}, id="no-address"),
    pytest.param({"address": "::"}, id="--address=::"),
    pytest.param({"address": None, "FLOWER_ADDRESS": "0.0.0.0"}, id="FLOWER_ADDRESS"),
    pytest.param({"address": "0.0.0.0", "FLOWER_BASIC_AUTH": "admin:"}, id="empty-password"),
])
def test_flower_beyond_localhost_without_auth_refuses_to_start(fleet, how):
    # Given Flower asked to listen beyond localhost without (usable) basic auth or OAuth
    process, _ = start_flower(fleet, wait=False, **how)

    # When it starts, then it exits non-zero with one message that says what to set
    assert process.popen.wait(60) != 0
    log = process.log.read_text()
    assert log.count(REFUSAL) == 1, log
    assert "FLOWER_BASIC_AUTH=user:password" in log and "--address=127.0.0.1" in log
    assert "Traceback" not in log


def test_flower_on_all_interfaces_with_basic_auth_answers_only_with_credentials(fleet):
    # Given Flower on every interface with FLOWER_BASIC_AUTH=user:secret
    process, url = start_flower(fleet, address="0.0.0.0", FLOWER_BASIC_AUTH="user:secret")

    # When it is asked without credentials, with wrong ones, and with the right ones
    # Then only the right ones get through, to pages and API alike
    for path in ("/", "/tasks", "/api/workers"):
        assert httpx.get(url + path, timeout=10).status_code == 401, path
        assert httpx.get(url + path, auth=("user", "wrong"), timeout=10).status_code == 401, path
        assert httpx.get(url + path, auth=("user", "secret"), timeout=10).status_code == 200, path
    # (Flower exempts /healthcheck and /metrics by design: restrict them at the network level)
    assert httpx.get(url + "/healthcheck", timeout=10).status_code == 200
    # And its log never shows the password
    assert REFUSAL not in process.log.read_text()
    assert "secret" not in process.log.read_text()


@pytest.fixture
def locked_fleet(tmp_path: Path):
    """A fleet whose Redis requires a password (in REDIS_URL) and whose server requires an API key."""
    password, api_key = "redispw-" + secrets.token_hex(8), "sk-" + secrets.token_hex(12)
    fleet = Fleet(tmp_path, "")
    port = free_port()
    data = fleet.logs / f"redis-{port}"
    data.mkdir(parents=True)
    server = spawn(f"redis-{port}", [redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1",
                                     "--save", "", "--appendonly", "no", "--dir", str(data),
                                     "--requirepass", password], fleet.logs)
    fleet.processes.append(server)
    fleet.redis_url = f"redis://:{password}@127.0.0.1:{port}/0"
    try:
        wait_for(lambda: redis.Redis.from_url(fleet.redis_url).ping(), 20, "redis with a password", server)
        yield fleet, password, api_key
    finally:
        fleet.stop()


def test_no_password_or_api_key_appears_in_logs_status_or_flower(locked_fleet, tmp_path):
    fleet, password, api_key = locked_fleet
    # Given a worker and Flower (basic auth) whose REDIS_URL has a password and whose server needs an API key
    _, server = fleet.standin("--api-key", api_key)
    worker_process = fleet.worker("w1", [server], SGLANG_API_KEY=api_key)
    auth = ("admin", "pw-" + secrets.token_hex(8))
    flower, url = start_flower(fleet, FLOWER_BASIC_AUTH=":".join(auth))
    worker = f"w1@{HOST}"
    wait_for(lambda: worker_online(url, worker), 60, "flower seeing w1 online")

    # When prompts are generated and an operator looks at status and at every Flower page
    enqueue = fleet.producer("enqueue", str(write_prompts(tmp_path / "p.jsonl", varied_prompts(3))))
    assert fleet.wait_finished() == {"done": 3}
    status = fleet.producer("status")
    wait_for(lambda: succeeded(url, worker) == 3, 30, "flower counting 3 succeeded tasks")
    pages = {path: httpx.get(url + path, auth=auth, timeout=30) for path in (
        "/", "/workers?json=1&refresh=1", f"/worker/{worker}", "/tasks", "/task/default:p-0000",
        "/broker", "/api/workers?refresh=1", "/api/tasks", "/api/queues/length", "/metrics")}

    # Then neither secret shows anywhere: not in Flower's or the worker's log, not in the
    # producer's output, not on any Flower page (the password is masked, e.g. redis://:**@)
    assert all(r.status_code == 200 for r in pages.values()), {p: r.status_code for p, r in pages.items()}
    seen = {"flower log": flower.log.read_text(), "worker log": worker_process.log.read_text(),
            "enqueue": enqueue.stdout + enqueue.stderr, "status": status.stdout + status.stderr,
            **{f"flower {p}": r.text for p, r in pages.items()}}
    for where, text in seen.items():
        assert password not in text, where
        assert api_key not in text, where
        assert auth[1] not in text, where
    assert "redis://:**@127.0.0.1" in seen["flower log"]
