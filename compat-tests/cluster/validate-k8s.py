#!/usr/bin/env python3
"""Checks the structure of config/kubernetes/kafka-rs.yaml (no cluster is needed or used).

validate-k8s.py [path]        validates; prints one line per problem, exits 1 when there is any
validate-k8s.py --selftest    also checks that broken variants of the file are rejected

Checked, as kubeconform and the API server would and beyond: every document has apiVersion,
kind and metadata.name, with the apiVersion its kind lives in; a headless Service (clusterIP
None, publishNotReadyAddresses) named as the StatefulSet's serviceName; every Service and the
PodDisruptionBudget select the pods' labels and the StatefulSet's selector matches its
template; the broker's command sets node.id from the pod ordinal (+1), names every pod
<sts>-<i>.<service> once in controller.quorum.voters at the CONTROLLER port, one voter per
replica, advertises the pod's own name on the headless service, listens on the ports the
container declares, and sets replication factors 3 and min.insync.replicas 2; readiness and
liveness probe the client port; the data volume claim is mounted at log.dirs.
Run with the compat venv (compat-tests/.cache/venv, `install.sh python` installs PyYAML).
"""
import os
import re
import sys

import checks

import yaml

API = {"Service": "v1", "StatefulSet": "apps/v1", "PodDisruptionBudget": "policy/v1"}
EXPECTED = {
    "default.replication.factor": "3",
    "min.insync.replicas": "2",
    "offsets.topic.replication.factor": "3",
    "controller.listener.names": "CONTROLLER",
}


def overrides(command):
    """key=value pairs of `--override k=v` in the container's command (a shell script)."""
    text = " ".join(str(c) for c in command or [])
    return dict(m.groups() for m in re.finditer(r"--override\s+([\w.]+)=(\S+)", text)), text


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def validate(docs):
    errors = []
    by_kind = {}
    for d in docs:
        if not isinstance(d, dict):
            errors.append("a document is not a mapping")
            continue
        kind, name = d.get("kind"), (d.get("metadata") or {}).get("name")
        if not kind or not name:
            errors.append(f"document without kind or metadata.name: {kind} {name}")
            continue
        if API.get(kind) != d.get("apiVersion"):
            errors.append(f"{kind} {name}: apiVersion {d.get('apiVersion')!r}, expected {API.get(kind)!r}")
        by_kind.setdefault(kind, {})[name] = d
    sts_all = by_kind.get("StatefulSet", {})
    if len(sts_all) != 1:
        return errors + [f"expected one StatefulSet, got {sorted(sts_all)}"]
    sts_name, sts = next(iter(sts_all.items()))
    spec = sts.get("spec") or {}
    labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
    if not selects((spec.get("selector") or {}).get("matchLabels"), labels):
        errors.append("StatefulSet: selector does not match the template's labels")
    services = by_kind.get("Service", {})
    headless = services.get(spec.get("serviceName"))
    if headless is None:
        errors.append(f"StatefulSet: serviceName {spec.get('serviceName')!r} is no Service here")
    else:
        hs = headless.get("spec") or {}
        if hs.get("clusterIP") != "None":
            errors.append("headless Service: clusterIP must be None")
        if hs.get("publishNotReadyAddresses") is not True:
            errors.append("headless Service: publishNotReadyAddresses must be true (voters meet before ready)")
    for name, svc in services.items():
        if not selects((svc.get("spec") or {}).get("selector"), labels):
            errors.append(f"Service {name}: selector does not match the pods' labels")
    for name, pdb in by_kind.get("PodDisruptionBudget", {}).items():
        if not selects(((pdb.get("spec") or {}).get("selector") or {}).get("matchLabels"), labels):
            errors.append(f"PodDisruptionBudget {name}: selector does not match the pods' labels")
    if spec.get("podManagementPolicy") != "Parallel":
        errors.append("StatefulSet: podManagementPolicy must be Parallel (a quorum needs its voters together)")
    containers = ((spec.get("template") or {}).get("spec") or {}).get("containers") or []
    if len(containers) != 1:
        return errors + ["StatefulSet: expected one container"]
    c = containers[0]
    cfg, text = overrides(c.get("command"))
    for k, want in EXPECTED.items():
        if cfg.get(k) != want:
            errors.append(f"broker: {k} is {cfg.get(k)!r}, expected {want!r}")
    if not re.search(r"node\.id=\$\(\(\s*\$\{POD_NAME##\*-\}\s*\+\s*1\s*\)\)", text):
        errors.append("broker: node.id must be the pod ordinal + 1 (${POD_NAME##*-} + 1)")
    ports = {p.get("name"): p.get("containerPort") for p in c.get("ports") or []}
    listeners = dict(re.findall(r"(\w+)://[^:,]*:(\d+)", cfg.get("listeners", "")))
    if set(listeners) != {"PLAINTEXT", "CONTROLLER"}:
        errors.append(f"broker: listeners must be PLAINTEXT and CONTROLLER, got {sorted(listeners)}")
    client, controller = int(listeners.get("PLAINTEXT", -1)), int(listeners.get("CONTROLLER", -1))
    if ports.get("client") != client or ports.get("controller") != controller:
        errors.append(f"broker: container ports {ports} do not match the listeners {listeners}")
    replicas = spec.get("replicas")
    svc = spec.get("serviceName")
    voters = {}
    for part in cfg.get("controller.quorum.voters", "").split(","):
        m = re.fullmatch(r"(\d+)@([\w.-]+):(\d+)", part)
        if not m:
            errors.append(f"broker: voter {part!r} malformed")
            continue
        voters[int(m.group(1))] = (m.group(2), int(m.group(3)))
    want = {i + 1: (f"{sts_name}-{i}.{svc}", controller) for i in range(int(replicas or 0))}
    if voters != want:
        errors.append(f"broker: voters {voters} must be one per replica: {want}")
    adv = cfg.get("advertised.listeners", "")
    if not adv.startswith(f"PLAINTEXT://${{POD_NAME}}.{svc}.") or not adv.endswith(f":{client}"):
        errors.append(f"broker: advertised.listeners {adv!r} must be the pod's name on the headless service")
    for probe in ("readinessProbe", "livenessProbe"):
        port = ((c.get(probe) or {}).get("tcpSocket") or {}).get("port")
        if port != client:
            errors.append(f"broker: {probe} must check the client port {client}, got {port}")
    claims = [(t.get("metadata") or {}).get("name") for t in spec.get("volumeClaimTemplates") or []]
    mounts = {m.get("name"): m.get("mountPath") for m in c.get("volumeMounts") or []}
    if not any(mounts.get(cl) == cfg.get("log.dirs") for cl in claims):
        errors.append(f"broker: no volume claim mounted at log.dirs ({cfg.get('log.dirs')!r})")
    return errors


def variants():
    """Broken variants of the file, each of which must be rejected."""
    def sts(d):
        return next(x for x in d if x.get("kind") == "StatefulSet")

    def container(d):
        return sts(d)["spec"]["template"]["spec"]["containers"][0]

    def replace_in_command(d, old, new):
        c = container(d)
        c["command"] = [str(x).replace(old, new) for x in c["command"]]

    return {
        "four replicas, three voters": lambda d: sts(d)["spec"].__setitem__("replicas", 4),
        "not headless": lambda d: next(x for x in d if x["metadata"]["name"] == "kafka-rs")["spec"].pop("clusterIP"),
        "voter at the wrong pod": lambda d: replace_in_command(d, "2@kafka-rs-1", "2@kafka-rs-2"),
        "node id from 0": lambda d: replace_in_command(d, "+ 1 ))", "+ 0 ))"),
        "min isr 1": lambda d: replace_in_command(d, "min.insync.replicas=2", "min.insync.replicas=1"),
        "probe on metrics": lambda d: container(d)["readinessProbe"].__setitem__("tcpSocket", {"port": 9404}),
        "data not mounted": lambda d: container(d).__setitem__("volumeMounts", []),
        "selector mismatch": lambda d: sts(d)["spec"]["selector"].__setitem__("matchLabels", {"app": "other"}),
        "wrong apiVersion": lambda d: sts(d).__setitem__("apiVersion", "apps/v1beta1"),
    }


def main(argv):
    here = os.path.dirname(os.path.abspath(__file__))

    def check(docs, path, self_test):
        return validate(docs), (not self_test or checks.selftest(docs, validate, variants()))

    return checks.main(
        argv,
        __doc__,
        os.path.join(here, "..", "..", "config", "kubernetes", "kafka-rs.yaml"),
        lambda f: [d for d in yaml.safe_load_all(f) if d is not None],
        check,
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
