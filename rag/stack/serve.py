"""`rag serve`: boot Ray and the app that inference.yaml names, on this machine, or deploy
the app onto a running Ray cluster (`--address`).

Shows each engine's state while it loads, probes all four with a real request,
prints the base URL, then serves until Ctrl-C (or SIGTERM), when it shuts Serve
and the local Ray cluster down so that no process is left behind; on a cluster it
deletes the app and leaves the cluster running.

Over 300 lines because a boot is one story told in order (ports, Ray, the app, the
wait with each engine's state, the probe, the stop) and each step's failure message
needs what the step before it learned; split, the reader would jump between files.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import re
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any
from urllib.parse import urlsplit

import httpx

from rag.errors import ServeError
from rag.guard import CHAT_GUARD_FORMATS, NO_REPLY
from rag.served import facts_from_models
from rag.stack import auth, footprint, hardware
from rag.stack.loopback import LOOPBACK_ENV
from rag.stack.process import end_tree
from rag.stack.profiles import cpu_model_set

__all__ = ["OFFLINE_ENV", "SERVE_ENV", "first_answer", "port_holder", "probe", "serve_forever"]

Log = Callable[[str], None]
APP_NAME = "default"  # Serve's name for the app `rag serve` runs (what _run names it unless told)
LOOPBACK = "127.0.0.1"
RAY_LOGS = Path("/tmp/ray/session_latest/logs")  # where a local Ray cluster writes engine logs
FIRST_QUESTION = "In one sentence: what does a reranker do in a retrieval pipeline?"

# Keep every process off the network: no hub, no telemetry.
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}
# What a request and each streamed token cost on their way through Serve, cut (issue 18,
# `rag bench --systems ours,bare`, README "Benchmark"). Set before Ray starts, so the
# controller, the proxy and every replica read them: user code on the replica's own
# event loop (no hop between two loops per chunk), the router in it too, access logs
# written 1,000 lines at a time and not copied to stderr, gRPC between proxy and
# replicas, no prompt of every request in the replica's log (a privacy leak as well).
SERVE_ENV = {
    # Ray starts each worker (every replica, every engine) at nice 15, below its own
    # daemons and any client on the machine, where bare vLLM runs at 0: on 2 cores an
    # engine would yield its core to whatever else is busy.
    "RAY_worker_niceness": "0",
    "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0",
    "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0",
    "RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE": "1000",
    "RAY_SERVE_LOG_TO_STDERR": "0",
    "RAY_SERVE_USE_GRPC_BY_DEFAULT": "1",
    "RAYLLM_ENABLE_REQUEST_PROMPT_LOGS": "0",
    # Serve's controller reconciles every deployment 10 times a second by default: 1.5 s
    # of a core per idle 30 s here, the busiest process of an idle stack. Twice a
    # second: 0.3 s; a replica's death or readiness is seen 0.4 s later at most.
    "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.5",
    # The key check and the admission count in Ray's proxy, before a request crosses a
    # handle (rag/stack/front_door.py): a refusal no longer waits on the ingress.
    "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH": "rag.stack.front_door:proxy_middlewares",
}


def port_holder(host: str, port: int) -> str | None:
    """None if host:port can be bound; else who holds it, as well as can be told."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            return None
        except OSError as exc:
            reason = exc.strerror or str(exc)
    try:
        import psutil

        for conn in psutil.net_connections(kind="tcp"):
            if conn.laddr and conn.laddr.port == port and conn.status == "LISTEN" and conn.pid:
                proc = psutil.Process(conn.pid)
                return f"pid {conn.pid} ({' '.join(proc.cmdline()[:3])})"
    except Exception:  # best effort: the port is taken either way
        pass
    return reason


def _connect_host(host: str) -> str:
    """Where this machine reaches a server listening on `host`, as a URL's host part."""
    host = {"0.0.0.0": LOOPBACK, "": LOOPBACK, "::": "::1"}.get(host, host)
    return f"[{host}]" if ":" in host else host


def _load_module(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    if spec is None or spec.loader is None:
        raise ServeError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


def probe(base_url: str, timeout_s: float = 60.0, api_key: str | None = None) -> dict[str, str]:
    """Send each engine one tiny real request; role -> "ok" or the error text."""
    results: dict[str, str] = {}
    requests: dict[str, tuple[str, dict[str, Any]]] = {
        "chat": (
            "/chat/completions",
            {"model": "chat", "messages": [{"role": "user", "content": "Say ok."}], "max_tokens": 2},
        ),
        "embed": ("/embeddings", {"model": "embed", "input": ["ok"]}),
        "score": ("/score", {"model": "score", "text_1": "ok", "text_2": ["ok"]}),
        "guard": ("/score", {"model": "guard", "text_1": "hello", "text_2": [NO_REPLY]}),
    }
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with httpx.Client(base_url=base_url, timeout=timeout_s, headers=headers) as client:
        models = client.get("/models").json()
        facts = facts_from_models(models)
        for role, (path, body) in requests.items():
            if role not in facts:
                results[role] = "not served"
                continue
            if (
                role == "guard" and facts[role].get("guard_format") in CHAT_GUARD_FORMATS
            ):  # answers through chat
                path, body = requests["chat"][0], {**requests["chat"][1], "model": "guard"}
            r = client.post(path, json=body)
            results[role] = "ok" if r.status_code == 200 else f"{r.status_code}: {r.text[:200]}"
    return results


def first_answer(base_url: str, question: str = FIRST_QUESTION, api_key: str | None = None) -> str:
    """One real chat completion, so a person sees the stack answer."""
    body = {"model": "chat", "messages": [{"role": "user", "content": question}], "max_tokens": 48}
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    r = httpx.post(f"{base_url}/chat/completions", json=body, timeout=120, headers=headers)
    r.raise_for_status()
    return " ".join(str(r.json()["choices"][0]["message"]["content"]).split())


def deployment_states(app_name: str = APP_NAME) -> dict[str, tuple[str, str]]:
    """(status, message) of each deployment of the Serve app, by role ("chat", "RagIngress");
    empty before the app exists."""
    from ray import serve

    status = serve.status()
    app = status.applications.get(app_name)
    if app is None:
        return {}
    return {
        name.split(":", 1)[-1]: (str(d.status.value if hasattr(d.status, "value") else d.status), d.message)
        for name, d in app.deployments.items()
    }


_ERROR_LINE = re.compile(r"^\s*(?:[\w.]*(?:Error|Exception)|Value error)\b[:,]?\s")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _short(message: str) -> str:
    """The most telling line of a deployment's failure message (usually a traceback)."""
    lines = [_ANSI.sub("", ln).strip() for ln in message.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if _ERROR_LINE.match(ln):
            return ln[:400]
    return (lines[-1] if lines else "no message")[:400]


def _stop(log: Log, address: str | None = None) -> None:
    """Shut Serve and Ray down, then end any process of ours that outlived them; on a
    cluster (`address`), delete the app and leave the cluster to whoever runs it."""
    import psutil
    import ray
    from ray import serve

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut this short
    if address:
        log(f"stopping: deleting the app from the cluster at {address} (the cluster runs on) ...")
        try:
            serve.delete(APP_NAME)
        finally:
            ray.shutdown()
        log("stopped")
        return
    log("stopping: shutting down Serve and the local Ray cluster ...")
    tree = psutil.Process().children(recursive=True)
    try:
        serve.shutdown()  # type: ignore[no-untyped-call]
    except Exception as exc:  # still shut Ray down below
        log(f"  serve.shutdown failed: {exc}")
    ray.shutdown()
    ended = end_tree(tree)
    log(f"stopped{f' (ended {ended} leftover processes)' if ended else ''}")


RAY_START_TRIES = 2
# "[2026-12-03 09:42:38,221 E 28783 28813] (raylet) agent_manager.cc:87: The raylet exited ..."
_RAY_ERROR = re.compile(r"^\[[\d:, -]+ [EF] \d+ \d+\] \(\w+\) \S+:\d+: (.+)")


def _ray_start_failure(metrics_port: int | None) -> str:
    """Why the node of a failed ray.init did not come up, read from its session's logs."""
    agent = RAY_LOGS / "dashboard_agent.log"
    if metrics_port and agent.exists() and "Address already in use" in agent.read_text(errors="replace"):
        return f"Ray's metrics agent could not bind port {metrics_port} (--metrics-port)"
    raylet = RAY_LOGS / "raylet.out"
    if raylet.exists():
        lines = raylet.read_text(errors="replace").splitlines()
        errors = [m.group(1) for m in map(_RAY_ERROR.match, lines) if m]
        if errors:
            return f"raylet: {errors[-1]}"
    return ""


def _join_ray(address: str, env: dict[str, str]) -> None:
    """Connect to a running cluster as this app's driver, `env` set in its processes.

    `auto` means the cluster `ray start` last started or joined on this machine, never
    Ray's fallback of any Ray process found running (a private `rag serve`'s included).
    The address is tried first: Ray waits minutes on one where nothing listens."""
    import ray
    from ray._private import ray_constants

    from rag.stack.cluster import resolve, unreachable

    target = resolve(address)
    if target is None:
        raise ServeError(
            "--address auto: no Ray cluster was started or joined with `ray start` on this machine; "
            "start one (docs/cluster.md) or give its address (HEAD:6379, ray://HEAD:10001)"
        )
    if (problem := unreachable(target)) is not None:
        raise ServeError(
            f"nothing answers at --address {address} ({problem}): give the head's GCS address "
            "(HEAD:6379), its Ray Client address (ray://HEAD:10001), or `auto` on one of its nodes"
        )
    host = urlsplit(target if "://" in target else f"ray://{target}").hostname or ""
    if auth.is_loopback(host):  # a one-machine cluster: keep Ray on loopback too
        os.environ[ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR] = "0"
        ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        ray.init(
            address=target, runtime_env={"env_vars": env}, log_to_driver=False, logging_level=logging.WARNING
        )
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ServeError(
            f"cannot join the Ray cluster at {target} ({str(exc).splitlines()[0]}): start one with "
            "`ray start --head` and every node's environment from `rag serve-config` (docs/cluster.md), "
            "or leave --address out to boot a private one"
        ) from exc


def _start_ray(num_cpus: int, host: str, metrics_port: int | None, log: Log) -> None:
    """Start the private local Ray cluster; one more try if its node does not come up.

    Ray gives a new node 30 s to register, then raises. It misses that when one of its
    agents cannot bind its port (--metrics-port taken after our check, even by a port
    Ray bound for itself meanwhile) or on a stalled machine. The failed try's processes
    are ended before the next, and the error names the cause found in Ray's logs.
    """
    import psutil
    import ray

    # Ray turns a loopback node address into the machine's reachable one unless this
    # switch (meant for laptops) is off; with it, every Ray server binds 127.0.0.1. Ray's
    # processes read it from their environment, this one from the constant Ray set on
    # import (which may have happened already).
    from ray._private import ray_constants

    os.environ[ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    os.environ[LOOPBACK_ENV] = "1"  # and Serve's replicas too (rag/stack/loopback.py)
    for attempt in range(1, RAY_START_TRIES + 1):
        try:
            ray.init(
                # A new private instance, never a cluster a `ray start` on this machine recorded
                # (ray.init's default would join it, and refuse num_cpus for it).
                address="local",
                num_cpus=num_cpus,
                include_dashboard=False,
                # One machine: Ray's GCS, raylet, agents, every worker's gRPC port and the
                # metrics endpoint listen on loopback only (Ray binds 0.0.0.0 otherwise);
                # Serve's HTTP proxy alone listens on --host.
                _node_ip_address=LOOPBACK,
                # Ray's metrics agent serves every process's metrics here; None: a random port.
                _metrics_export_port=metrics_port,
                log_to_driver=False,  # engine logs go to Ray's session folder, not the terminal
                logging_level=logging.WARNING,
            )
            return
        except (TypeError, ValueError):  # our arguments, not the machine: no second try
            raise
        except Exception as exc:  # Ray raises a bare Exception for a node that did not come up
            why = _ray_start_failure(metrics_port) or str(exc).split(". ")[0]
            ray.shutdown()
            end_tree(psutil.Process().children(recursive=True))
            holder = port_holder(host, metrics_port) if metrics_port else None
            if holder is not None:
                raise ServeError(
                    f"Ray did not start ({why}); port {metrics_port} is taken ({holder}): stop that "
                    "process or pick another port with --metrics-port (or RAG_METRICS_PORT; 0 turns "
                    "metrics off)"
                ) from exc
            if attempt == RAY_START_TRIES:
                raise ServeError(
                    f"Ray did not start, {RAY_START_TRIES} tries: {why} (logs: {RAY_LOGS})"
                ) from exc
            log(f"Ray did not start ({why}); trying once more")


class _Stop(Exception):
    pass


def _raise_stop(signum: int, frame: FrameType | None) -> None:
    raise _Stop(signal.Signals(signum).name)


def serve_forever(
    module_path: Path,
    *,
    host: str,
    port: int,
    profile: str,
    num_cpus: int,
    boot_timeout_s: float,
    log: Log,
    on_ready: Callable[[str], None],
    metrics_port: int | None = None,
    api_keys: tuple[str, ...] = (),
    exit_after_ready: bool = False,
    address: str | None = None,
    head_proxy_only: bool = False,
    deploy_file: Path | None = None,
) -> None:
    """Boot, wait until all four engines answer, call on_ready(url), serve until stopped.

    With `address` (`auto`, `ray://HEAD:10001`), the app goes onto that running cluster
    instead of a private one: Ray's ports and Serve's settings are the cluster's (its
    nodes' environment, docs/cluster.md), Serve's proxies listen on `host` on its nodes
    (on the head alone with `head_proxy_only`), and the keys' digests are computed here,
    as on one machine.

    With `metrics_port`, Ray's Prometheus endpoint (vLLM engine and Serve metrics)
    listens on that port of 127.0.0.1, and /metrics relays it behind the API key.
    With `api_keys`, every route but /health needs one of them. The keys stay in this
    process: they are taken out of the environment Ray's processes inherit, and the
    serve module hands the ingress only their digests.
    """
    ports = [] if address else [(port, "--port (or RAG_PORT)")]
    if metrics_port and not address:
        ports.append((metrics_port, "--metrics-port (or RAG_METRICS_PORT; 0 turns metrics off)"))
    for number, option in ports:
        holder = port_holder(host, number)
        if holder is not None:
            raise ServeError(
                f"port {number} on {host} is taken ({holder}); stop that process or pick another "
                f"port with {option}"
            )
    os.environ.update(OFFLINE_ENV)
    for name, value in SERVE_ENV.items():  # a value set by the user wins
        os.environ.setdefault(name, value)
    os.environ["RAG_PROFILE"] = profile
    for name in (auth.KEY_ENV, auth.KEY_FILE_ENV):  # not for Ray's processes to inherit
        os.environ.pop(name, None)

    from ray import serve

    start = time.monotonic()
    if address:
        log(f"joining the Ray cluster at {address}; Serve on {host}:{port} on its nodes [profile {profile}]")
    else:
        log(f"starting Ray ({num_cpus} logical CPUs) and Serve on {host}:{port} [profile {profile}]")
    if profile == "cpu":
        from rag.stack.prepare import describe_chat

        cpu = hardware.detect()
        log(cpu.describe())
        log(describe_chat(cpu_model_set(), cpu.dtype))
    if address:
        env = {**OFFLINE_ENV, "RAG_PROFILE": profile}
        env.update(
            {
                k: os.environ[k]
                for k in ("RAG_MODELS_DIR", "RAG_CPU_MODELS", "RAG_INDEX_DIR")
                if k in os.environ
            }
        )
        _join_ray(address, env)
        metrics_port = 0  # the cluster's metrics are the cluster's (each node's export port)
    else:
        _start_ray(num_cpus, host, metrics_port or None, log)
    logging.getLogger("ray.serve").setLevel(logging.WARNING)  # per-deployment option dumps
    try:
        logs = RAY_LOGS
        where = "HeadOnly" if head_proxy_only else None  # None: Serve's default, every node
        serve.start(proxy_location=where, http_options={"host": host, "port": port})
        # For the serve module, read in this process only (Ray's are started already).
        os.environ[auth.KEY_ENV] = ",".join(api_keys)
        os.environ["RAG_METRICS_PORT"] = str(metrics_port or 0)
        if deploy_file is not None:  # whose replicas: block the module reads (--file)
            os.environ["RAG_DEPLOY_FILE"] = str(deploy_file.resolve())
        # vLLM logs to stdout on import; stdout is for the URL alone.
        with contextlib.redirect_stdout(sys.stderr):
            module = _load_module(module_path)
            app = module.app  # built only now, after ray.init
        # Ray installs a crash handler for SIGTERM that re-raises it and kills this
        # process mid-shutdown; ours replace it (and un-ignore SIGINT under `&`).
        signal.signal(signal.SIGTERM, _raise_stop)
        signal.signal(signal.SIGINT, _raise_stop)
        serve._run(app, name=APP_NAME, _blocking=False)  # returns at once; progress is polled below
        last = ""
        while True:
            elapsed = time.monotonic() - start
            states = deployment_states()
            # Loading local weights is deterministic: the first failed start is final,
            # so say so now rather than after Serve's retries (minutes on CPU).
            failed = {
                n: m
                for n, (s, m) in states.items()
                if s in ("DEPLOY_FAILED", "UNHEALTHY") or "failed to start" in m
            }
            if failed:
                name, message = next(iter(failed.items()))
                raise ServeError(f"engine `{name}` failed to load: {_short(message)} (full logs: {logs})")
            line = "  ".join(f"{n}: {s.lower()}" for n, (s, _) in sorted(states.items()))
            if line != last:
                log(f"  [{elapsed:4.0f}s] {line}")
                last = line
            if states and all(s == "HEALTHY" for s, _ in states.values()):
                break
            if elapsed > boot_timeout_s:
                raise ServeError(
                    f"engines not ready after {boot_timeout_s:.0f} s ({line}); raise "
                    f"--boot-timeout or read the logs in {logs}"
                )
            time.sleep(2)
        url = f"http://{_connect_host(host)}:{port}/v1"
        key = api_keys[0] if api_keys else None
        results = probe(url, api_key=key)
        bad = {r: v for r, v in results.items() if v != "ok"}
        if bad:
            raise ServeError(
                "engines are up but did not answer: "
                + "; ".join(f"{r}: {v}" for r, v in bad.items())
                + f" (logs: {logs})"
            )
        log(f"all four engines answered in {time.monotonic() - start:.0f} s")
        if api_keys:
            log(f"API keys: {len(api_keys)} accepted; every route but /health needs `Authorization: Bearer`")
        else:
            log(f"no API key set: anyone who reaches {host}:{port} may use the engines")
        if metrics_port:
            log(
                f"metrics: http://127.0.0.1:{metrics_port}/metrics on this machine, "
                f"{url.removesuffix('/v1')}/metrics{' with a key' if api_keys else ''} (Prometheus)"
            )
        if not address:  # on a cluster the engines are other machines' processes
            mem = footprint.measure(os.getpid(), "rag serve")
            log(f"memory: {mem.summary()}")
            log(
                "  per engine: " + ", ".join(f"{r} {b / footprint.GiB:.2f}" for r, b in mem.by_role().items())
            )
        log(f"ready in {time.monotonic() - start:.0f} s")
        on_ready(url)
        # After the URL: every engine has answered the probe; a real answer is for the
        # person watching, and on a slow CPU it takes seconds (48 tokens at 10/s).
        try:
            log(f"first answer from `chat`: {first_answer(url, api_key=key)}")
        except httpx.HTTPError as exc:  # the probe passed; a slow first answer is no reason to stop
            log(f"first answer from `chat` failed: {exc}")
        if exit_after_ready:
            return
        while True:
            time.sleep(3600)
    except (KeyboardInterrupt, _Stop):
        pass
    finally:
        _stop(log, address)
