#!/usr/bin/env python3
"""Checks the structure of the repository's docker-compose.yml (the 3-broker cluster).

validate-compose.py [path]      validates (default: docker-compose.yml at the repo root);
                                prints one line per problem, exits 1 when there is any
validate-compose.py --selftest  also checks that broken variants of the file are rejected

Checked: exactly three broker services broker1..3 built from the repo's Dockerfile as
kafka-rs:latest with stop_signal SIGTERM; node.id 1..3, unique, matching the service name;
the same controller.quorum.voters on every broker, naming every node once at its service's
host and its CONTROLLER listener port; PLAINTEXT and CONTROLLER listeners,
controller.listener.names=CONTROLLER; advertised PLAINTEXT address = the service's host name
and its PLAINTEXT port; that port published on the host under the same number, host ports
unique; a volume of its own at log.dirs; replication factors 3 and min.insync.replicas 2.
The dispatcher service: built from the repository's Dockerfile target `dispatcher`; its
config file (mounted read-only from the repository) is TOML naming the compose brokers'
PLAINTEXT addresses, listening on 0.0.0.0 with its HTTP and gRPC ports published under the
same numbers, advertising its internal listener at its own host name; every queue's topic
created by a one-shot kafka-topics.sh service the dispatcher waits for.
Run with the compat venv (compat-tests/.cache/venv, `install.sh python` installs PyYAML).
"""
import os
import sys
import tomllib

import checks

import yaml

BROKERS = ["broker1", "broker2", "broker3"]
EXPECTED = {
    "default.replication.factor": "3",
    "min.insync.replicas": "2",
    "offsets.topic.replication.factor": "3",
    "controller.listener.names": "CONTROLLER",
}


def overrides(service):
    """The key=value pairs of a service's `--override k=v` command (list or string form)."""
    cmd = service.get("command") or []
    if isinstance(cmd, str):
        cmd = cmd.split()
    out, errors = {}, []
    i = 0
    while i < len(cmd):
        arg = str(cmd[i])
        if arg == "--override" and i + 1 < len(cmd):
            kv = str(cmd[i + 1])
            i += 2
        elif arg.startswith("--override="):
            kv = arg[len("--override="):]
            i += 1
        else:
            errors.append(f"unexpected command argument {arg!r}")
            i += 1
            continue
        if "=" not in kv:
            errors.append(f"override {kv!r} is not key=value")
            continue
        k, v = kv.split("=", 1)
        if k in out:
            errors.append(f"key {k} given twice")
        out[k] = v
    return out, errors


def listeners(value):
    """'NAME://host:port,...' -> {NAME: (host, port)}; raises ValueError."""
    out = {}
    for part in filter(None, (p.strip() for p in value.split(","))):
        name, rest = part.split("://", 1)
        host, port = rest.rsplit(":", 1)
        out[name] = (host.strip("[]"), int(port))
    return out


def voters(value):
    """'1@host:port,...' -> {1: (host, port)}; raises ValueError."""
    out = {}
    for part in filter(None, (p.strip() for p in value.split(","))):
        node, addr = part.split("@", 1)
        host, port = addr.rsplit(":", 1)
        if int(node) in out:
            raise ValueError(f"node {node} named twice")
        out[int(node)] = (host, int(port))
    return out


def host_ports(service):
    """Published ports as (host port, container port) pairs, short or long syntax."""
    out = []
    for p in service.get("ports") or []:
        if isinstance(p, dict):
            out.append((int(p.get("published", -1)), int(p.get("target", -1))))
            continue
        parts = str(p).split("/")[0].split(":")
        if len(parts) == 1:
            out.append((-1, int(parts[0])))
        else:
            out.append((int(parts[-2]), int(parts[-1])))
    return out


def validate(doc):
    errors = []
    if not isinstance(doc, dict) or not isinstance(doc.get("services"), dict):
        return ["no services: mapping"]
    services = doc["services"]
    brokers = sorted(n for n, s in services.items() if isinstance(s, dict) and s.get("image") == "kafka-rs:latest")
    if brokers != BROKERS:
        errors.append(f"broker services (image kafka-rs:latest) are {brokers}, expected {BROKERS}")
    top_volumes = doc.get("volumes") or {}
    configs, node_ids, used_host_ports, used_volumes = {}, {}, {}, {}
    for name in BROKERS:
        s = services.get(name)
        if not isinstance(s, dict):
            errors.append(f"{name}: missing")
            continue
        build = s.get("build")
        context = build.get("context") if isinstance(build, dict) else build
        if context not in (".", "./"):
            errors.append(f"{name}: build must be the repository (.), not {context!r}")
        if s.get("stop_signal") != "SIGTERM":
            errors.append(f"{name}: stop_signal must be SIGTERM")
        cfg, errs = overrides(s)
        errors += [f"{name}: {e}" for e in errs]
        configs[name] = cfg
        host = s.get("hostname", name)
        if host != name:
            errors.append(f"{name}: hostname {host!r} differs from the service name")
        try:
            node_id = int(cfg.get("node.id", ""))
        except ValueError:
            errors.append(f"{name}: node.id missing or not a number")
            continue
        if node_id in node_ids:
            errors.append(f"{name}: node.id {node_id} also used by {node_ids[node_id]}")
        node_ids[node_id] = name
        if f"broker{node_id}" != name:
            errors.append(f"{name}: node.id {node_id} does not match the service name")
        for k, want in EXPECTED.items():
            if cfg.get(k) != want:
                errors.append(f"{name}: {k} is {cfg.get(k)!r}, expected {want!r}")
        try:
            lst = listeners(cfg.get("listeners", ""))
        except ValueError:
            errors.append(f"{name}: listeners {cfg.get('listeners')!r} malformed")
            continue
        if set(lst) != {"PLAINTEXT", "CONTROLLER"}:
            errors.append(f"{name}: listeners must be PLAINTEXT and CONTROLLER, got {sorted(lst)}")
            continue
        try:
            adv = listeners(cfg.get("advertised.listeners", ""))
        except ValueError:
            adv = {}
        plain_port = lst["PLAINTEXT"][1]
        if adv.get("PLAINTEXT") != (name, plain_port):
            errors.append(f"{name}: advertised PLAINTEXT must be {name}:{plain_port}, got {adv.get('PLAINTEXT')}")
        if "CONTROLLER" in adv:
            errors.append(f"{name}: the CONTROLLER listener must not be advertised")
        ports = host_ports(s)
        if (plain_port, plain_port) not in ports:
            errors.append(f"{name}: client port {plain_port} not published as {plain_port}:{plain_port}")
        for hp, _ in ports:
            if hp in used_host_ports:
                errors.append(f"{name}: host port {hp} also published by {used_host_ports[hp]}")
            used_host_ports[hp] = name
        if lst["CONTROLLER"][1] in [cp for hp, cp in ports if hp == lst["CONTROLLER"][1]]:
            errors.append(f"{name}: the controller port should not be published")
        log_dir = cfg.get("log.dirs")
        mounts = [str(v).split(":") for v in s.get("volumes") or []]
        vol = [m[0] for m in mounts if len(m) >= 2 and m[1] == log_dir]
        if not log_dir or not vol:
            errors.append(f"{name}: no volume mounted at log.dirs ({log_dir!r})")
        else:
            if vol[0] not in top_volumes:
                errors.append(f"{name}: volume {vol[0]} not declared under volumes:")
            if vol[0] in used_volumes:
                errors.append(f"{name}: volume {vol[0]} shared with {used_volumes[vol[0]]}")
            used_volumes[vol[0]] = name
    if sorted(node_ids) != [1, 2, 3]:
        errors.append(f"node ids are {sorted(node_ids)}, expected [1, 2, 3]")
    voter_values = {cfg.get("controller.quorum.voters") for cfg in configs.values()}
    if configs and len(voter_values) != 1:
        errors.append(f"controller.quorum.voters differs between brokers: {sorted(map(str, voter_values))}")
    for name, cfg in configs.items():
        try:
            v = voters(cfg.get("controller.quorum.voters", ""))
        except ValueError as e:
            errors.append(f"{name}: controller.quorum.voters malformed ({e})")
            continue
        if sorted(v) != sorted(node_ids):
            errors.append(f"{name}: voters {sorted(v)} are not the node ids {sorted(node_ids)}")
        for nid, (host, port) in v.items():
            owner = node_ids.get(nid)
            if owner is None:
                continue
            if host != owner:
                errors.append(f"{name}: voter {nid} at host {host!r}, but node {nid} is {owner}")
            try:
                cport = listeners(configs[owner].get("listeners", ""))["CONTROLLER"][1]
            except (KeyError, ValueError):
                continue
            if port != cport:
                errors.append(f"{name}: voter {nid} port {port} is not {owner}'s CONTROLLER port {cport}")
    return errors


def validate_dispatcher(doc, base_dir):
    errors = []
    services = doc.get("services") or {}
    d = services.get("dispatcher")
    if not isinstance(d, dict):
        return ["dispatcher: missing"]
    build = d.get("build")
    if not isinstance(build, dict) or build.get("context") not in (".", "./") or build.get("target") != "dispatcher":
        errors.append("dispatcher: build must be the repository (.) with target dispatcher")
    cmd = [str(a) for a in d.get("command") or []]
    if len(cmd) != 2 or cmd[0] != "--config":
        return errors + [f"dispatcher: command must be --config <file>, got {cmd}"]
    mounts = [str(v).split(":") for v in d.get("volumes") or []]
    source = [m[0] for m in mounts if len(m) >= 2 and m[1] == cmd[1]]
    if not source:
        return errors + [f"dispatcher: nothing mounted at {cmd[1]}"]
    path = os.path.join(base_dir, source[0])
    try:
        with open(path, "rb") as f:
            cfg = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as e:
        return errors + [f"dispatcher: config {source[0]}: {e}"]
    plain = {}
    for name in BROKERS:
        try:
            cfg_b, _ = overrides(services[name])
            host, port = listeners(cfg_b["advertised.listeners"])["PLAINTEXT"]
            plain[f"{host}:{port}"] = name
        except (KeyError, ValueError, TypeError):
            pass
    boot = [b.strip() for b in str(cfg.get("bootstrap_servers", "")).split(",") if b.strip()]
    if not boot or any(b not in plain for b in boot):
        errors.append(f"dispatcher: bootstrap_servers {boot} must name the brokers' advertised addresses {sorted(plain)}")
    ports = host_ports(d)
    for key in ("http_listen", "grpc_listen"):
        addr = str(cfg.get(key, ""))
        host, _, port = addr.rpartition(":")
        if host != "0.0.0.0" or not port.isdigit():
            errors.append(f"dispatcher: {key} {addr!r} must listen on 0.0.0.0:<port>")
        elif (int(port), int(port)) not in ports:
            errors.append(f"dispatcher: {key} port {port} not published as {port}:{port}")
    if str(cfg.get("advertised_internal", "")).split(":")[0] != d.get("hostname", "dispatcher"):
        errors.append("dispatcher: advertised_internal must name the service's host name")
    created = {}
    for name, svc in services.items():
        args = [str(a) for a in (svc.get("entrypoint") or []) if isinstance(svc, dict)]
        if args and args[0].endswith("kafka-topics.sh") and "--create" in args and "--topic" in args:
            created[args[args.index("--topic") + 1]] = name
    deps = d.get("depends_on") or {}
    for q in cfg.get("queue") or []:
        topic = q.get("topic")
        if topic not in created:
            errors.append(f"dispatcher: queue {q.get('name')!r}: topic {topic!r} is created by no kafka-topics.sh service")
        elif not isinstance(deps, dict) or (deps.get(created[topic]) or {}).get("condition") != "service_completed_successfully":
            errors.append(f"dispatcher: must wait for {created[topic]} (condition service_completed_successfully)")
    if not cfg.get("queue"):
        errors.append("dispatcher: no [[queue]] in its config")
    return errors


def variants():
    """Broken variants of the file, each of which must be rejected."""
    def set_override(d, svc, key, value):
        cmd = d["services"][svc]["command"]
        for i, arg in enumerate(cmd):
            if str(arg).startswith(key + "="):
                cmd[i] = f"{key}={value}"
                return d
        raise KeyError(key)

    def drop(d, svc):
        del d["services"][svc]
        return d

    def port(d, svc, p):
        d["services"][svc]["ports"] = [p]
        return d

    def vol(d, svc, v):
        d["services"][svc]["volumes"] = [v]
        return d

    return {
        "duplicate node id": lambda d: set_override(d, "broker2", "node.id", "1"),
        "inconsistent voters": lambda d: set_override(d, "broker3", "controller.quorum.voters", "1@broker1:9095,2@broker2:9095,3@broker3:9096"),
        "voter at wrong host": lambda d: [set_override(d, b, "controller.quorum.voters", "1@broker2:9095,2@broker2:9095,3@broker3:9095") for b in BROKERS][0],
        "two brokers": lambda d: drop(d, "broker3"),
        "clashing host port": lambda d: port(d, "broker2", "9092:9093"),
        "shared volume": lambda d: vol(d, "broker2", "broker1-data:/var/lib/kafka-rs/data"),
        "advertised localhost": lambda d: set_override(d, "broker1", "advertised.listeners", "PLAINTEXT://localhost:9092"),
        "min isr 1": lambda d: set_override(d, "broker1", "min.insync.replicas", "1"),
        "dispatcher config not mounted": lambda d: vol(d, "dispatcher", "./config/none.toml:/etc/other.toml:ro"),
        "dispatcher port not published": lambda d: port(d, "dispatcher", "8080:8080"),
        "no dispatcher": lambda d: drop(d, "dispatcher"),
        "dispatcher does not wait for its topic": lambda d: d["services"]["dispatcher"].pop("depends_on"),
    }


def main(argv):
    here = os.path.dirname(os.path.abspath(__file__))

    def check(doc, path, self_test):
        base_dir = os.path.dirname(os.path.abspath(path))

        def validate_all(d):
            return validate(d) + validate_dispatcher(d, base_dir)

        errors = validate_all(doc)
        return errors, (not self_test or checks.selftest(doc, validate_all, variants()))

    return checks.main(argv, __doc__, os.path.join(here, "..", "..", "docker-compose.yml"), yaml.safe_load, check)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
