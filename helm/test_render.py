#!/usr/bin/env python3
"""Proves that the Helm chart renders the objects, values and checks of OPERATIONS.md §10 (as far
as this build goes), and that the container args and environment it renders start the real
binary: a pod's command line is run on loopback ports with a temporary data directory and its own
probes, scrape annotations and credentials are exercised over HTTP; and the default three pods,
their headless DNS names mapped to loopback, form one cluster (CLUSTER.md §7). The scale-in guard
Job's rendered command line runs with the binary's CLI against a fake members endpoint on loopback
and against those three pods.

Usage: helm/test_render.py [CHART_DIR]   (default helm/narad; NARAD_BIN overrides the binary,
default target/debug/narad). Every helm call and every wait is bounded (the three-pod cluster: 60 s
to form); every broker started is stopped, on failure or SIGTERM too. Exit status 1 when a check
fails; every check runs and each failure is printed.
"""

import base64
import http.server
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.error
import urllib.request

import yaml

from testlib import free_ports

ROOT = pathlib.Path(__file__).resolve().parent.parent
CHART = pathlib.Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else ROOT / "helm" / "narad"
EVERYTHING = ROOT / "helm" / "test-values" / "everything.yaml"
BIN = pathlib.Path(os.environ.get("NARAD_BIN", ROOT / "target" / "debug" / "narad"))
RELEASE = "narad"
NS = "narad"
HELM_TIMEOUT_S = 60
BOOT_WAIT_S = 30
CLUSTER_WAIT_S = 60
STOP_WAIT_S = 20
SEL = {"app.kubernetes.io/name": "narad", "app.kubernetes.io/instance": RELEASE}
RELEASE_PODS = [{"podSelector": {"matchLabels": SEL}}]
# The scale-in guard Job's pod labels: never SEL's pair, which would put it behind the Services.
GUARD_LABELS = {
    "app.kubernetes.io/name": "narad-scalein-guard",
    "app.kubernetes.io/instance": RELEASE,
    "app.kubernetes.io/component": "scalein-guard",
}
GUARD_SCRIPT = CHART / "files" / "scalein-guard.sh"

# The environment the default values render (plain values; the valueFrom ones are checked apart).
DEFAULT_ENV = {
    "NARAD_LOG_LEVEL": "info",
    "NARAD_LOG_FORMAT": "json",
    "NARAD_TOPIC_DEFAULT_PARTITIONS": "3",
    "NARAD_TOPIC_MAX_PARTITIONS": "108",
    "NARAD_TOPIC_DEFAULT_RETENTION_AGE_MS": "43200000",
    "NARAD_TOPIC_DEFAULT_VISIBILITY_TIMEOUT_MS": "30000",
    "NARAD_TOPIC_DEFAULT_MAX_IN_FLIGHT_PER_PARTITION": "1024",
    "NARAD_TOPIC_DEFAULT_MAX_ACKED_AHEAD_PER_PARTITION": "1024",
    "NARAD_HTTP_MAX_CONSUME_WAIT": "10s",
    "NARAD_HTTP_METRICS_ADDR": ":9100",
    "NARAD_SECURITY_ENABLED": "true",
    "NARAD_REMOTES_ALLOWED_PORTS": "443",
    "NARAD_REMOTES_MAX_HELD_BYTES": "268435456",
    "NARAD_REMOTES_API_HOP_ENCRYPTED": "false",
}
# What a peer list adds to it (the default: three pods, all peers, all initial members).
PODS = ["narad-0", "narad-1", "narad-2"]
HEADLESS = "narad-headless.narad.svc.cluster.local"
DEFAULT_CLUSTER_ENV = {
    "NARAD_CLUSTER_PEERS": ",".join(f"{p}@{p}.{HEADLESS}:7943" for p in PODS),
    "NARAD_CLUSTER_INITIAL_MEMBERS": ",".join(PODS),
    "NARAD_CLUSTER_ADVERTISE_ADDR": f"$(POD_NAME).{HEADLESS}:7943",
    "NARAD_SECURITY_ALLOW_PLAINTEXT_RAFT": "true",
}
CLUSTER_ENV_NAMES = set(DEFAULT_CLUSTER_ENV) | {
    "NARAD_CLUSTER_SECRET", "NARAD_SECURITY_ALLOW_INSECURE_CLUSTER", "NARAD_SECURITY_ALLOW_LEGACY_CLUSTER_AUTH",
}
# A single node: no peer list (OPERATIONS.md §10.2 allows initialClusterSize 1).
ONE_NODE = ("replicaCount=1", "initialClusterSize=1")
DEFAULT_ARGS = [
    "serve",
    "--addr=:7942",
    "--cluster-port=7943",
    "--node-id=$(POD_NAME)",
    "--data-dir=/var/lib/narad",
]


class RenderError(Exception):
    pass


def helm_template(sets=(), values=(), chart=CHART, set_json=()):
    cmd = ["helm", "template", RELEASE, str(chart), "--namespace", NS]
    for v in values:
        cmd += ["-f", str(v)]
    for s in sets:
        cmd += ["--set", s]
    for s in set_json:
        cmd += ["--set-json", s]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=HELM_TIMEOUT_S)


def render(*sets, values=(), set_json=(), chart=CHART):
    """The rendered objects by (kind, name); raises RenderError when helm fails."""
    r = helm_template(sets, values, chart, set_json)
    if r.returncode != 0:
        raise RenderError(f"helm template {list(sets)} {list(set_json)} failed: {r.stderr.strip()}")
    objs = {}
    for doc in yaml.safe_load_all(r.stdout):
        if doc is None:
            continue
        key = (doc["kind"], doc["metadata"]["name"])
        assert key not in objs, f"{key} rendered twice"
        objs[key] = doc
    return objs


def render_error(*sets, set_json=()):
    """helm template's error text for values it must refuse."""
    r = helm_template(sets, set_json=set_json)
    assert r.returncode != 0, f"helm template {list(sets)} {list(set_json)} succeeded, expected a refusal"
    return r.stderr


def sts(objs, name="narad"):
    return objs[("StatefulSet", name)]


def pod(objs, name="narad"):
    return sts(objs, name)["spec"]["template"]["spec"]


def container(objs, name="narad"):
    cs = pod(objs, name)["containers"]
    assert len(cs) == 1, cs
    return cs[0]


def env_values(c):
    """Plain env values by name (valueFrom entries excluded)."""
    return {e["name"]: e["value"] for e in c["env"] if "value" in e}


def env_from(c):
    return {e["name"]: e["valueFrom"] for e in c["env"] if "valueFrom" in e}


def env_names(c):
    names = [e["name"] for e in c["env"]]
    assert len(names) == len(set(names)), f"duplicate env names: {names}"
    return names


def ports_of(c):
    return [(p["name"], p["containerPort"], p["protocol"]) for p in c["ports"]]


def expand(text, defined):
    """The kubelet's $(VAR) expansion (k8s.io/kubernetes third_party/forked/golang/expansion):
    $(NAME) of a defined variable becomes its value, of an undefined one stays as written, and $$
    is one $."""
    return re.sub(
        r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)",
        lambda m: "$" if m.group(0) == "$$" else defined.get(m.group(1), m.group(0)),
        text,
    )


def pod_command(st, ordinal, secret=None):
    """The args and environment the kubelet gives the container of pod <StatefulSet>-<ordinal>:
    fieldRefs, the Secret's keys from `secret` (a required key it lacks fails, as the kubelet
    refuses to start the container), env values expanded against the variables defined before
    them, args against all of them."""
    pod_name = f"{st['metadata']['name']}-{ordinal}"
    (c,) = st["spec"]["template"]["spec"]["containers"]
    env = {}
    for e in c["env"]:
        if "value" in e:
            env[e["name"]] = expand(e["value"], env)
            continue
        src = e["valueFrom"]
        if "fieldRef" in src:
            env[e["name"]] = {"metadata.name": pod_name, "metadata.namespace": NS}[src["fieldRef"]["fieldPath"]]
        elif "secretKeyRef" in src:
            ref = src["secretKeyRef"]
            if secret and ref["key"] in secret:
                env[e["name"]] = secret[ref["key"]]
            else:
                assert ref.get("optional"), f"{e['name']}: required Secret key {ref['key']} absent"
        else:
            raise AssertionError(f"unexpected valueFrom {src}")
    return [expand(a, env) for a in c["args"]], env


def np_rules(np):
    """The NetworkPolicy spec's ingress rules as (set of (port, protocol), from-list or None)."""
    out = []
    for rule in np["ingress"]:
        assert rule.get("ports"), f"a rule without ports admits every port: {rule}"
        ports = {(p["port"], p.get("protocol", "TCP")) for p in rule["ports"]}
        out.append((ports, rule.get("from")))
    return out


def admitting(np, port, proto):
    return [frm for ports, frm in np_rules(np) if (port, proto) in ports]


def eq(actual, expected, what):
    assert actual == expected, f"{what}: expected {expected!r}, got {actual!r}"


CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


@check
def default_render_has_exactly_the_default_objects():
    objs = render()
    eq(
        set(objs),
        {
            ("StatefulSet", "narad"),
            ("Service", "narad-headless"),
            ("Service", "narad"),
            ("ServiceAccount", "narad"),
            ("PodDisruptionBudget", "narad"),
            ("NetworkPolicy", "narad"),
            ("Job", "narad-scalein-guard"),
        },
        "objects",
    )


@check
def default_statefulset():
    objs = render()
    s = sts(objs)["spec"]
    eq(s["replicas"], 3, "replicas")
    eq(s["podManagementPolicy"], "Parallel", "podManagementPolicy")
    eq(s["updateStrategy"], {"type": "RollingUpdate"}, "updateStrategy")
    eq(s["serviceName"], "narad-headless", "serviceName")
    eq(s["selector"]["matchLabels"], SEL, "selector")
    eq(s["template"]["metadata"]["labels"], SEL, "pod labels (no chart version: upgrades alone must not restart pods)")
    p = pod(objs)
    eq(p["terminationGracePeriodSeconds"], 30, "terminationGracePeriodSeconds")
    eq(p["serviceAccountName"], "narad", "serviceAccountName")
    eq(p["automountServiceAccountToken"], False, "pod automountServiceAccountToken")
    eq(p["securityContext"]["fsGroup"], 10001, "fsGroup")
    eq(p["securityContext"]["fsGroupChangePolicy"], "OnRootMismatch", "fsGroupChangePolicy")
    eq(p["securityContext"]["seccompProfile"], {"type": "Localhost", "localhostProfile": "profiles/narad-seccomp.json"}, "seccompProfile")
    # The profile the values name is the one the chart ships (helm/seccomp_check.py tests its rules).
    assert (CHART / "files" / "narad-seccomp.json").is_file(), "files/narad-seccomp.json missing"
    assert "volumes" not in p, f"default pod has volumes: {p.get('volumes')}"
    c = container(objs)
    eq(c["image"], "ghcr.io/debanganthakuria/narad:latest", "image")
    eq(c["args"], DEFAULT_ARGS, "args")
    env_names(c)
    eq(env_values(c), DEFAULT_ENV | DEFAULT_CLUSTER_ENV, "env values")
    eq(
        env_from(c),
        {
            "POD_NAME": {"fieldRef": {"fieldPath": "metadata.name"}},
            "POD_NAMESPACE": {"fieldRef": {"fieldPath": "metadata.namespace"}},
            "NARAD_NODE_ID": {"fieldRef": {"fieldPath": "metadata.name"}},
            "NARAD_ADMIN_PASSWORD": {
                "secretKeyRef": {"name": "narad-security", "key": "admin-password", "optional": True}
            },
            # Required: a secured cluster does not start without it (CLUSTER.md §12).
            "NARAD_CLUSTER_SECRET": {"secretKeyRef": {"name": "narad-security", "key": "cluster-secret"}},
        },
        "env valueFrom",
    )
    eq(
        ports_of(c),
        [("api", 7942, "TCP"), ("peer-udp", 7942, "UDP"), ("cluster", 7943, "TCP"), ("metrics", 9100, "TCP")],
        "container ports",
    )
    eq(c["startupProbe"], {"httpGet": {"path": "/healthz", "port": "metrics"}, "periodSeconds": 2, "failureThreshold": 30}, "startupProbe")
    eq(c["livenessProbe"], {"httpGet": {"path": "/healthz", "port": "metrics"}, "periodSeconds": 10, "failureThreshold": 6}, "livenessProbe")
    eq(c["readinessProbe"], {"httpGet": {"path": "/readyz", "port": "api"}, "periodSeconds": 5, "failureThreshold": 3}, "readinessProbe")
    eq(
        sts(objs)["spec"]["template"]["metadata"]["annotations"],
        {"prometheus.io/scrape": "true", "prometheus.io/port": "9100", "prometheus.io/path": "/metrics"},
        "pod annotations",
    )
    eq(c["resources"], {"requests": {"cpu": "500m", "memory": "512Mi"}}, "resources")
    sc = c["securityContext"]
    for k, v in [("runAsUser", 10001), ("runAsGroup", 10001), ("runAsNonRoot", True), ("allowPrivilegeEscalation", False)]:
        eq(sc[k], v, f"securityContext.{k}")
    eq(sc["capabilities"]["drop"], ["ALL"], "capabilities.drop")
    eq(c["volumeMounts"], [{"name": "data", "mountPath": "/var/lib/narad"}], "volumeMounts")
    (vct,) = s["volumeClaimTemplates"]
    eq(vct["metadata"], {"name": "data"}, "volumeClaimTemplate metadata")
    eq(vct["spec"], {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "10Gi"}}}, "volumeClaimTemplate spec")


@check
def default_services_serviceaccount_pdb():
    objs = render()
    h = objs[("Service", "narad-headless")]["spec"]
    eq(h["clusterIP"], "None", "headless clusterIP")
    eq(h["publishNotReadyAddresses"], True, "headless publishNotReadyAddresses")
    eq(h["selector"], SEL, "headless selector")
    eq(
        [(p["name"], p["port"], p["protocol"], p["targetPort"]) for p in h["ports"]],
        [("peer-udp", 7942, "UDP", "peer-udp"), ("cluster", 7943, "TCP", "cluster")],
        "headless ports",
    )
    i = objs[("Service", "narad")]["spec"]
    eq(i["type"], "ClusterIP", "internal type")
    eq(i["selector"], SEL, "internal selector")
    eq(
        [(p["name"], p["port"], p["protocol"], p["targetPort"]) for p in i["ports"]],
        [("api", 7942, "TCP", "api"), ("metrics", 9100, "TCP", "metrics")],
        "internal ports",
    )
    eq(objs[("ServiceAccount", "narad")]["automountServiceAccountToken"], False, "ServiceAccount automount")
    pdb = objs[("PodDisruptionBudget", "narad")]["spec"]
    eq(pdb, {"maxUnavailable": 1, "selector": {"matchLabels": SEL}}, "PodDisruptionBudget spec")


@check
def default_networkpolicy_fences_cluster_ports():
    np = render()[("NetworkPolicy", "narad")]["spec"]
    eq(np["podSelector"], {"matchLabels": SEL}, "NetworkPolicy podSelector")
    eq(np["policyTypes"], ["Ingress"], "policyTypes")
    for port, proto in [(7943, "TCP"), (7942, "UDP")]:
        froms = admitting(np, port, proto)
        assert froms, f"no rule admits {port}/{proto}"
        for frm in froms:
            eq(frm, RELEASE_PODS, f"sources admitted to {port}/{proto}")
    eq(admitting(np, 7942, "TCP"), [None], "API 7942/tcp sources (open)")
    eq(admitting(np, 9100, "TCP"), [None], "metrics 9100/tcp sources (open)")
    eq(admitting(np, 6060, "TCP"), [], "pprof 6060/tcp sources (pprof off)")
    eq(len(np["ingress"]), 3, "rule count")


@check
def metrics_disabled_moves_probes_to_api_and_drops_metrics_wiring():
    objs = render("metrics.enabled=false")
    c = container(objs)
    assert "NARAD_HTTP_METRICS_ADDR" not in env_names(c), "NARAD_HTTP_METRICS_ADDR still set"
    assert "metrics" not in [p[0] for p in ports_of(c)], "metrics container port still declared"
    eq(c["startupProbe"]["httpGet"]["port"], "api", "startupProbe port")
    eq(c["livenessProbe"]["httpGet"]["port"], "api", "livenessProbe port")
    eq(c["readinessProbe"]["httpGet"]["port"], "api", "readinessProbe port")
    assert "annotations" not in sts(objs)["spec"]["template"]["metadata"], "pod annotations left"
    eq([p["name"] for p in objs[("Service", "narad")]["spec"]["ports"]], ["api"], "internal Service ports")
    eq(admitting(objs[("NetworkPolicy", "narad")]["spec"], 9100, "TCP"), [], "metrics rule")


@check
def config_renders_configmap_flag_and_mount():
    config = {"storage": {"codec": "zstd"}, "http": {"max_connections": 100}}
    objs = render(set_json=[f"narad.config={json.dumps(config)}"])
    cm = objs[("ConfigMap", "narad-config")]
    eq(json.loads(cm["data"]["narad.json"]), config, "narad.json")
    c = container(objs)
    eq(c["args"], DEFAULT_ARGS + ["--config=/etc/narad/narad.json"], "args")
    assert {"name": "config", "mountPath": "/etc/narad/narad.json", "subPath": "narad.json", "readOnly": True} in c["volumeMounts"], c["volumeMounts"]
    eq(pod(objs)["volumes"], [{"name": "config", "configMap": {"name": "narad-config"}}], "volumes")
    assert "checksum/config" in sts(objs)["spec"]["template"]["metadata"]["annotations"], "no checksum/config annotation"
    # An empty config renders neither.
    objs = render(set_json=["narad.config={}"])
    assert ("ConfigMap", "narad-config") not in objs, "ConfigMap rendered for an empty narad.config"
    eq(container(objs)["args"], DEFAULT_ARGS, "args with empty config")


@check
def optional_objects_follow_their_switches():
    cases = [
        ("service.loadBalancer.enabled=true", ("Service", "narad-lb"), False),
        ("serviceMonitor.enabled=true", ("ServiceMonitor", "narad"), False),
        ("traefik.enabled=true", ("IngressRoute", "narad"), False),
        ("service.internal.enabled=false", ("Service", "narad"), True),
        ("podDisruptionBudget.enabled=false", ("PodDisruptionBudget", "narad"), True),
        ("serviceAccount.create=false", ("ServiceAccount", "narad"), True),
        ("scaleInGuard.enabled=false", ("Job", "narad-scalein-guard"), True),
    ]
    default = render()
    for s, key, on_by_default in cases:
        eq(key in default, on_by_default, f"{key} in the default render")
        eq(key in render(s), not on_by_default, f"{key} with {s}")
    objs = render("networkPolicy.enabled=false", "security.enabled=false")
    assert ("NetworkPolicy", "narad") not in objs, "NetworkPolicy with networkPolicy.enabled=false"


def guard_job(objs):
    (job,) = [o for k, o in objs.items() if k[0] == "Job"]
    return job


def guard_container(objs):
    (c,) = guard_job(objs)["spec"]["template"]["spec"]["containers"]
    return c


def selects(selector, labels):
    return all(labels.get(k) == v for k, v in selector.items())


@check
def scalein_guard_job_is_a_pre_upgrade_hook():
    """OPERATIONS.md §10.1: the pre-upgrade/pre-rollback hook Job, on by default: one try, a
    deadline, the chart's service account and security context, no API token, the chart's image
    running files/scalein-guard.sh under /bin/sh against the internal Service's API port, as the
    root admin with the security Secret's password."""
    objs = render()
    job = guard_job(objs)
    eq(job["metadata"]["name"], "narad-scalein-guard", "Job name")
    eq(job["apiVersion"], "batch/v1", "Job apiVersion")
    ann = job["metadata"]["annotations"]
    eq(set(ann["helm.sh/hook"].split(",")), {"pre-upgrade", "pre-rollback"}, "hook")
    eq(set(ann["helm.sh/hook-delete-policy"].split(",")), {"before-hook-creation", "hook-succeeded"}, "hook-delete-policy")
    eq(job["metadata"]["labels"]["app.kubernetes.io/component"], "scalein-guard", "Job component label")
    spec = job["spec"]
    eq(spec["backoffLimit"], 0, "backoffLimit")
    eq(spec["activeDeadlineSeconds"], 120, "activeDeadlineSeconds")
    eq(spec["template"]["metadata"]["labels"], GUARD_LABELS, "guard pod labels")
    p = spec["template"]["spec"]
    eq(p["restartPolicy"], "Never", "restartPolicy")
    eq(p["serviceAccountName"], pod(objs)["serviceAccountName"], "serviceAccountName (the chart's)")
    eq(p["automountServiceAccountToken"], False, "automountServiceAccountToken")
    eq(p["securityContext"]["seccompProfile"], {"type": "RuntimeDefault"}, "guard seccompProfile")
    c = guard_container(objs)
    eq(c["image"], container(objs)["image"], "guard image (the chart's)")
    sc = c["securityContext"]
    for k, v in [("runAsUser", 10001), ("runAsGroup", 10001), ("runAsNonRoot", True), ("allowPrivilegeEscalation", False), ("readOnlyRootFilesystem", True)]:
        eq(sc.get(k), v, f"guard securityContext.{k}")
    eq(sc["capabilities"]["drop"], ["ALL"], "guard capabilities.drop")
    eq(c["command"][:2], ["/bin/sh", "-c"], "guard command")
    eq(c["command"][2], GUARD_SCRIPT.read_text(), "guard script (files/scalein-guard.sh)")
    eq(len(c["command"]), 3, "guard command length")
    assert "args" not in c, c.get("args")
    api = {p["name"]: p["port"] for p in objs[("Service", "narad")]["spec"]["ports"]}["api"]
    eq(
        env_values(c),
        {
            "SCALEIN_GUARD_STATEFULSET": sts(objs)["metadata"]["name"],
            "SCALEIN_GUARD_REPLICAS": "3",
            "SCALEIN_GUARD_ALLOW": "0",
            "SCALEIN_GUARD_CREDENTIALS": "user admin, password from key admin-password of Secret narad-security",
            "NARAD_ADDR": f"http://narad:{api}",
            "NARAD_USER": "admin",
        },
        "guard env values",
    )
    eq(
        env_from(c),
        {"NARAD_PASS": {"secretKeyRef": {"name": "narad-security", "key": "admin-password", "optional": True}}},
        "guard env valueFrom",
    )
    # No Service, PodDisruptionBudget or NetworkPolicy of the release selects the guard's pod.
    for key, o in objs.items():
        sel = o["spec"].get("selector") if key[0] in ("Service", "PodDisruptionBudget") else None
        if key[0] == "PodDisruptionBudget":
            sel = sel["matchLabels"]
        if key[0] == "NetworkPolicy":
            sel = o["spec"]["podSelector"]["matchLabels"]
        if sel:
            assert not selects(sel, GUARD_LABELS), f"{key} selects the guard pod"
    # The API port is open by default: the guard's pod reaches it.
    eq(admitting(objs[("NetworkPolicy", "narad")]["spec"], api, "TCP"), [None], "API sources (open)")


@check
def scalein_guard_values_reach_the_job():
    c = guard_container(render("allowScaleInTo=3"))
    eq(env_values(c)["SCALEIN_GUARD_ALLOW"], "3", "allowScaleInTo")
    c = guard_container(render("replicaCount=5", "clusterPeerCount=5", "allowScaleInTo=5"))
    eq((env_values(c)["SCALEIN_GUARD_REPLICAS"], env_values(c)["SCALEIN_GUARD_ALLOW"]), ("5", "5"), "replicaCount and allowScaleInTo")
    c = guard_container(render("scaleInGuard.credentialsSecret=guard-creds"))
    eq(
        env_from(c),
        {
            "NARAD_USER": {"secretKeyRef": {"name": "guard-creds", "key": "username"}},
            "NARAD_PASS": {"secretKeyRef": {"name": "guard-creds", "key": "password"}},
        },
        "credentialsSecret",
    )
    assert "NARAD_USER" not in env_values(c), env_values(c)
    c = guard_container(render("security.existingSecret=s", "security.adminPasswordKey=pw"))
    eq(env_from(c)["NARAD_PASS"]["secretKeyRef"], {"name": "s", "key": "pw", "optional": True}, "security Secret's admin password")
    c = guard_container(render("security.enabled=false", "scaleInGuard.credentialsSecret=guard-creds"))
    eq({"NARAD_USER", "NARAD_PASS"} & set(env_names(c)), set(), "credentials with security off")
    eq(env_values(c)["SCALEIN_GUARD_CREDENTIALS"], "none (security off)", "credentials description")
    # No internal Service: pod 0 (kept by every replicaCount) by its headless name.
    c = guard_container(render("service.internal.enabled=false", "service.ports.api=8000"))
    eq(env_values(c)["NARAD_ADDR"], f"http://narad-0.{HEADLESS}:8000", "address without the internal Service")
    objs = render("fullnameOverride=q", "scaleInGuard.activeDeadlineSeconds=30", "commonLabels.team=queues", "image.tag=v9")
    job = guard_job(objs)
    eq(job["metadata"]["name"], "q-scalein-guard", "Job name (fullnameOverride)")
    eq(job["spec"]["activeDeadlineSeconds"], 30, "activeDeadlineSeconds")
    eq(job["spec"]["template"]["metadata"]["labels"], GUARD_LABELS | {"team": "queues"}, "guard pod labels (commonLabels)")
    eq(guard_container(objs)["image"], "ghcr.io/debanganthakuria/narad:v9", "guard image tag")
    eq(env_values(guard_container(objs))["NARAD_ADDR"], "http://q:7942", "address (fullnameOverride)")
    eq(env_values(guard_container(objs))["SCALEIN_GUARD_STATEFULSET"], "q", "StatefulSet (fullnameOverride)")
    name = guard_job(render("fullnameOverride=" + "n" * 63))["metadata"]["name"]
    assert len(name) <= 63 and name.endswith("-scalein-guard"), name
    # With apiFrom restricting the API port, the guard's pod is admitted by its labels; without
    # the guard, only apiFrom.
    peer = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "apps"}}}
    api_from = f"networkPolicy.apiFrom={json.dumps([peer])}"
    (frm,) = admitting(render(set_json=[api_from])[("NetworkPolicy", "narad")]["spec"], 7942, "TCP")
    eq(frm, [peer, {"podSelector": {"matchLabels": GUARD_LABELS}}], "API sources with apiFrom")
    objs = render("scaleInGuard.enabled=false", set_json=[api_from])
    (frm,) = admitting(objs[("NetworkPolicy", "narad")]["spec"], 7942, "TCP")
    eq(frm, [peer], "API sources with apiFrom, guard off")
    assert not [k for k in objs if k[0] == "Job"], "Job with scaleInGuard.enabled=false"


@check
def loadbalancer_servicemonitor_ingressroute_contents():
    objs = render(values=[EVERYTHING])
    lb = objs[("Service", "nd-lb")]
    eq(lb["metadata"]["annotations"], {"service.beta.kubernetes.io/aws-load-balancer-internal": "true"}, "LB annotations")
    s = lb["spec"]
    eq(s["type"], "LoadBalancer", "LB type")
    eq(s["externalTrafficPolicy"], "Local", "LB externalTrafficPolicy")
    eq(s["loadBalancerSourceRanges"], ["10.0.0.0/8"], "LB sourceRanges")
    eq(s["selector"], SEL, "LB selector")
    eq([(p["name"], p["port"]) for p in s["ports"]], [("api", 7942)], "LB ports")
    d = render("service.loadBalancer.enabled=true")[("Service", "narad-lb")]["spec"]
    eq(d["externalTrafficPolicy"], "Cluster", "LB default externalTrafficPolicy")
    assert "loadBalancerSourceRanges" not in d, d
    sm = objs[("ServiceMonitor", "nd")]
    eq(sm["metadata"]["labels"]["release"], "prometheus", "ServiceMonitor labels")
    eq(sm["spec"]["selector"], {"matchLabels": SEL}, "ServiceMonitor selector")
    eq(sm["spec"]["namespaceSelector"], {"matchNames": [NS]}, "ServiceMonitor namespaceSelector")
    eq(sm["spec"]["endpoints"], [{"port": "metrics", "path": "/metrics", "interval": "30s", "scrapeTimeout": "20s"}], "ServiceMonitor endpoints")
    d = render("serviceMonitor.enabled=true")[("ServiceMonitor", "narad")]["spec"]["endpoints"][0]
    eq((d["interval"], d["scrapeTimeout"]), ("15s", "10s"), "ServiceMonitor default interval/scrapeTimeout")
    ir = objs[("IngressRoute", "nd")]
    eq(ir["apiVersion"], "traefik.io/v1alpha1", "IngressRoute apiVersion")
    eq(ir["spec"]["entryPoints"], ["websecure"], "entryPoints")
    eq(ir["spec"]["tls"], {"secretName": "queue-tls"}, "IngressRoute tls")
    (route,) = ir["spec"]["routes"]
    eq(route["match"], "Host(`queue.example.org`) && !PathPrefix(`/metrics`) && !PathPrefix(`/v1/users`)", "route match")
    eq(route["services"], [{"name": "nd", "port": "api"}], "route services")
    eq(route["middlewares"], [{"name": "ratelimit"}], "route middlewares")
    d = render("traefik.enabled=true")[("IngressRoute", "narad")]["spec"]
    eq(d["entryPoints"], ["http"], "default entryPoints")
    eq(d["routes"][0]["match"], "Host(`narad.example.com`) && !PathPrefix(`/metrics`)", "default route match")


@check
def everything_enabled_statefulset_and_networkpolicy():
    objs = render(values=[EVERYTHING])
    eq(
        set(objs),
        {
            ("StatefulSet", "nd"), ("Service", "nd-headless"), ("Service", "nd"), ("Service", "nd-lb"),
            ("ServiceAccount", "nd"), ("PodDisruptionBudget", "nd"), ("NetworkPolicy", "nd"),
            ("ConfigMap", "nd-config"), ("ServiceMonitor", "nd"), ("IngressRoute", "nd"),
            ("Job", "nd-scalein-guard"),
        },
        "objects",
    )
    s = sts(objs, "nd")
    eq(s["spec"]["selector"]["matchLabels"], SEL, "selector (no commonLabels)")
    eq(s["metadata"]["labels"]["team"], "queues", "commonLabels on the StatefulSet")
    meta = s["spec"]["template"]["metadata"]
    eq((meta["labels"]["team"], meta["labels"]["tier"]), ("queues", "broker"), "pod labels")
    ann = meta["annotations"]
    for k, v in [("example.com/owner", "queues"), ("example.com/scraped", "yes"), ("prometheus.io/scrape", "true")]:
        eq(ann.get(k), v, f"pod annotation {k}")
    for key, obj in objs.items():
        eq(obj["metadata"]["labels"].get("team"), "queues", f"commonLabels on {key}")
    p = pod(objs, "nd")
    eq(p["imagePullSecrets"], [{"name": "regcred"}], "imagePullSecrets")
    eq(p["nodeSelector"], {"kubernetes.io/arch": "amd64"}, "nodeSelector")
    eq(p["tolerations"][0]["key"], "dedicated", "tolerations")
    assert "podAntiAffinity" in p["affinity"], p.get("affinity")
    eq(p["topologySpreadConstraints"][0]["topologyKey"], "topology.kubernetes.io/zone", "topologySpreadConstraints")
    assert "volumeClaimTemplates" not in s["spec"], "volumeClaimTemplates with persistence.enabled=false"
    eq(
        p["volumes"],
        [
            {"name": "data", "emptyDir": {}},
            {"name": "config", "configMap": {"name": "nd-config"}},
            {"name": "cluster-tls", "secret": {"secretName": "raft-tls"}},
        ],
        "volumes",
    )
    c = container(objs, "nd")
    eq(c["args"], DEFAULT_ARGS + ["--config=/etc/narad/narad.json"], "args")
    env = env_values(c)
    expected = dict(DEFAULT_ENV)
    expected.update(
        {
            "NARAD_LOG_LEVEL": "debug",
            "NARAD_LOG_FORMAT": "text",
            "NARAD_HTTP_MAX_CONSUME_WAIT": "20s",
            "NARAD_HTTP_PPROF_ADDR": ":6060",
            "NARAD_CLUSTER_TLS_CERT_FILE": "/etc/narad/cluster-tls/tls.crt",
            "NARAD_CLUSTER_TLS_KEY_FILE": "/etc/narad/cluster-tls/tls.key",
            "NARAD_CLUSTER_TLS_CA_FILE": "/etc/narad/cluster-tls/ca.crt",
            "NARAD_REMOTES_ALLOWED_HOSTS": "a.example.com,*.example.org",
            "NARAD_REMOTES_ALLOWED_PORTS": "443,8443",
            "NARAD_REMOTES_ALLOW_ADDRESSES": "10.1.0.0/16",
            "NARAD_REMOTES_MAX_HELD_BYTES": "536870912",
            "NARAD_REMOTES_API_HOP_ENCRYPTED": "true",
            "NARAD_HTTP_SHUTDOWN_GRACE": "30s",
            "NARAD_HTTP_WRITE_TIMEOUT": "60s",
        }
    )
    eq(env, expected, "env values")
    eq(env_from(c)["NARAD_ADMIN_PASSWORD"]["secretKeyRef"]["name"], "narad-secrets", "existingSecret")
    eq(CLUSTER_ENV_NAMES & set(env_names(c)), set(), "cluster variables of a single node")
    assert ("pprof", 6060, "TCP") in ports_of(c), ports_of(c)
    assert {"name": "cluster-tls", "mountPath": "/etc/narad/cluster-tls", "readOnly": True} in c["volumeMounts"], c["volumeMounts"]
    np = objs[("NetworkPolicy", "nd")]["spec"]
    values = yaml.safe_load(EVERYTHING.read_text())["networkPolicy"]
    for port, proto in [(7943, "TCP"), (7942, "UDP")]:
        for frm in admitting(np, port, proto):
            eq(frm, RELEASE_PODS, f"sources admitted to {port}/{proto}")
    rules = np_rules(np)
    # apiFrom, and the scale-in guard's pod by its labels.
    eq(rules[1], ({(7942, "TCP")}, values["apiFrom"] + [{"podSelector": {"matchLabels": GUARD_LABELS}}]), "API rule")
    eq(rules[2], ({(9100, "TCP")}, values["metricsFrom"]), "metrics rule")
    eq(rules[3], ({(6060, "TCP")}, values["pprofFrom"]), "pprof rule")
    eq(np["ingress"][4:], values["extraIngress"], "extraIngress appended")
    eq(len(rules), 5, "rule count")
    # pprof on without pprofFrom: nobody is admitted to it.
    np = render("narad.pprof.enabled=true")[("NetworkPolicy", "narad")]["spec"]
    eq(admitting(np, 6060, "TCP"), [], "pprof sources without pprofFrom")


@check
def persistence_values_reach_the_claim_only():
    objs = render(
        "persistence.size=50Gi", "persistence.storageClassName=fast", "persistence.accessModes={ReadWriteOncePod}",
        "persistence.annotations.backup=daily", "commonLabels.team=queues",
    )
    (vct,) = sts(objs)["spec"]["volumeClaimTemplates"]
    eq(vct["metadata"], {"name": "data", "annotations": {"backup": "daily"}}, "claim metadata (no commonLabels)")
    eq(
        vct["spec"],
        {"accessModes": ["ReadWriteOncePod"], "storageClassName": "fast", "resources": {"requests": {"storage": "50Gi"}}},
        "claim spec",
    )
    eq(sts(objs)["spec"]["selector"]["matchLabels"], SEL, "selector (no commonLabels)")


@check
def validation_refuses_with_the_spec_messages():
    refused = [
        (["initialClusterSize=2"], "initialClusterSize must be odd (Raft quorum)."),
        (["initialClusterSize=0"], "initialClusterSize must be odd (Raft quorum)."),
        (["replicaCount=1"], "replicaCount (1) must be >= initialClusterSize (3)."),
        (["initialClusterSize=5"], "replicaCount (3) must be >= initialClusterSize (5)."),
        (["clusterPeerCount=1"], "clusterPeerCount (1) must be 0 (= initialClusterSize) or >= initialClusterSize (3)."),
        # This build's limits: the binary needs >= 3 peers and cannot join a pod outside them...
        (["replicaCount=1", "initialClusterSize=1", "clusterPeerCount=2"], "the peer list has 2 pods (clusterPeerCount, else initialClusterSize): the binary needs at least 3 peers, or 1 for a single node."),
        (["replicaCount=4"], "replicaCount (4) is above the peer list's size (3, clusterPeerCount or else initialClusterSize): this build cannot join a node outside NARAD_CLUSTER_PEERS yet."),
        (["initialClusterSize=1"], "replicaCount (3) is above the peer list's size (1, clusterPeerCount or else initialClusterSize)"),
        (["replicaCount=4", "clusterPeerCount=3"], "replicaCount (4) is above the peer list's size (3"),
        (["networkPolicy.enabled=false"], "security.enabled with security.clusterTLS.enabled=false leaves Raft traffic in plaintext"),
        (["serviceMonitor.enabled=true", "metrics.enabled=false"], "serviceMonitor.enabled needs metrics.enabled and service.internal.enabled"),
        (["serviceMonitor.enabled=true", "service.internal.enabled=false"], "serviceMonitor.enabled needs metrics.enabled and service.internal.enabled"),
        (["traefik.enabled=true", "service.internal.enabled=false"], "traefik.enabled needs service.internal.enabled"),
        (["security.enabled=false", "remotes.maxHeldBytes=5"], "remotes.* settings off their defaults require security.enabled"),
        (["security.enabled=false", "remotes.allowedPorts={9443}"], "remotes.* settings off their defaults require security.enabled"),
    ]
    for sets, message in refused:
        err = render_error(*sets)
        assert message in err, f"{sets}: expected {message!r} in helm's error, got {err.strip()!r}"
    # The other side of the security rule: any one of the three lets it render.
    for sets in (
        ["networkPolicy.enabled=false", "security.enabled=false"],
        ["networkPolicy.enabled=false", "security.allowPlaintextRaft=true"],
        [*ONE_NODE, "networkPolicy.enabled=false", "security.clusterTLS.enabled=true"],
        ["networkPolicy.enabled=false", "security.clusterTLS.enabled=true"],
        [*ONE_NODE, "clusterPeerCount=1"],
        ["clusterPeerCount=3"],
        ["clusterPeerCount=5"],
        ["clusterPeerCount=5", "replicaCount=5"],
        ["replicaCount=5", "initialClusterSize=5"],
        ["security.enabled=false"],
    ):
        render(*sets)


def peer_list(value):
    """NARAD_CLUSTER_PEERS as [(id, host, port)]."""
    out = []
    for entry in value.split(","):
        pid, _, addr = entry.partition("@")
        host, _, port = addr.rpartition(":")
        out.append((pid, host, int(port)))
    return out


@check
def default_pods_get_one_peer_list_and_their_own_identity():
    """Each of the three pods, its environment resolved as the kubelet does: the same peer list and
    initial members everywhere, naming the StatefulSet's pods by their headless Service DNS names
    and the cluster port; node id (flag and NARAD_NODE_ID) = pod name; advertise address = the
    pod's own headless name, the one its peers list for it."""
    objs = render()
    st = sts(objs)
    eq(st["spec"]["replicas"], 3, "replicas")
    headless_svc = objs[("Service", st["spec"]["serviceName"])]
    eq(headless_svc["spec"]["clusterIP"], "None", "serviceName is the headless Service")
    cluster_port = {p["name"]: p["port"] for p in headless_svc["spec"]["ports"]}["cluster"]
    eq(cluster_port, {p["name"]: p["containerPort"] for p in container(objs)["ports"]}["cluster"], "cluster port")
    domain = f"{st['spec']['serviceName']}.{NS}.svc.cluster.local"
    envs = []
    for i in range(3):
        args, env = pod_command(st, i, secret={"cluster-secret": "s3cret"})
        pod_name = f"{st['metadata']['name']}-{i}"
        eq(env["POD_NAME"], pod_name, "POD_NAME")
        eq(env["NARAD_NODE_ID"], pod_name, f"{pod_name}: NARAD_NODE_ID")
        assert f"--node-id={pod_name}" in args, f"{pod_name}: args {args}"
        eq(env["NARAD_CLUSTER_ADVERTISE_ADDR"], f"{pod_name}.{domain}:{cluster_port}", f"{pod_name}: advertise address")
        eq(env["NARAD_CLUSTER_SECRET"], "s3cret", f"{pod_name}: cluster secret")
        eq(env["NARAD_SECURITY_ALLOW_PLAINTEXT_RAFT"], "true", f"{pod_name}: plaintext Raft switch (NetworkPolicy on)")
        own = [(h, port) for pid, h, port in peer_list(env["NARAD_CLUSTER_PEERS"]) if pid == pod_name]
        eq([f"{h}:{port}" for h, port in own], [env["NARAD_CLUSTER_ADVERTISE_ADDR"]], f"{pod_name}: its own peer entry")
        envs.append(env)
    for name in ("NARAD_CLUSTER_PEERS", "NARAD_CLUSTER_INITIAL_MEMBERS"):
        eq({e[name] for e in envs}, {envs[0][name]}, f"{name} identical on every pod")
    eq(
        peer_list(envs[0]["NARAD_CLUSTER_PEERS"]),
        [(f"narad-{i}", f"narad-{i}.{domain}", cluster_port) for i in range(3)],
        "peers",
    )
    eq(envs[0]["NARAD_CLUSTER_INITIAL_MEMBERS"], "narad-0,narad-1,narad-2", "initial members")
    # Without the Secret's cluster-secret key the kubelet does not start the container.
    try:
        pod_command(st, 0)
    except AssertionError as e:
        assert "NARAD_CLUSTER_SECRET: required Secret key cluster-secret absent" in str(e), e
    else:
        raise AssertionError("NARAD_CLUSTER_SECRET is optional")


@check
def cluster_values_shape_the_peer_env():
    # Peer list and initial members sized apart; names, namespace, domain and port followed.
    objs = render("clusterPeerCount=5", "fullnameOverride=q", "clusterDomain=k8s.internal", "service.ports.cluster=17943")
    args, env = pod_command(sts(objs, "q"), 1, secret={"cluster-secret": "x"})
    eq(sts(objs, "q")["spec"]["serviceName"], "q-headless", "serviceName")
    eq(
        peer_list(env["NARAD_CLUSTER_PEERS"]),
        [(f"q-{i}", f"q-{i}.q-headless.{NS}.svc.k8s.internal", 17943) for i in range(5)],
        "peers (clusterPeerCount=5)",
    )
    eq(env["NARAD_CLUSTER_INITIAL_MEMBERS"], "q-0,q-1,q-2", "initial members (initialClusterSize=3)")
    eq(env["NARAD_CLUSTER_ADVERTISE_ADDR"], f"q-1.q-headless.{NS}.svc.k8s.internal:17943", "advertise address")
    assert "--cluster-port=17943" in args, args
    env = env_values(container(render("replicaCount=5", "initialClusterSize=5")))
    eq(len(peer_list(env["NARAD_CLUSTER_PEERS"])), 5, "peers (initialClusterSize=5)")
    eq(env["NARAD_CLUSTER_INITIAL_MEMBERS"].split(","), [f"narad-{i}" for i in range(5)], "initial members (5)")
    # The Secret and its key.
    ref = env_from(container(render("security.existingSecret=s", "security.clusterSecretKey=k")))["NARAD_CLUSTER_SECRET"]
    eq(ref, {"secretKeyRef": {"name": "s", "key": "k"}}, "cluster secret ref")
    # The plaintext-Raft switch: with security on it comes from the NetworkPolicy or the value.
    c = container(render("networkPolicy.enabled=false", "security.allowPlaintextRaft=true"))
    eq(env_values(c).get("NARAD_SECURITY_ALLOW_PLAINTEXT_RAFT"), "true", "plaintext switch from allowPlaintextRaft")
    c = container(render("security.enabled=false"))
    eq(env_values(c).get("NARAD_SECURITY_ALLOW_PLAINTEXT_RAFT"), None, "plaintext switch with security off")
    eq(env_from(c)["NARAD_CLUSTER_SECRET"]["secretKeyRef"].get("optional"), None, "secret required with security off")
    assert "NARAD_ADMIN_PASSWORD" not in env_names(c), "admin password with security off"
    # allowInsecureCluster: the secret becomes optional only with security off.
    c = container(render("security.enabled=false", "security.allowInsecureCluster=true", "security.allowLegacyClusterAuth=true"))
    eq(env_from(c)["NARAD_CLUSTER_SECRET"]["secretKeyRef"].get("optional"), True, "secret optional (security off, insecure allowed)")
    eq(env_values(c).get("NARAD_SECURITY_ALLOW_INSECURE_CLUSTER"), "true", "NARAD_SECURITY_ALLOW_INSECURE_CLUSTER")
    eq(env_values(c).get("NARAD_SECURITY_ALLOW_LEGACY_CLUSTER_AUTH"), "true", "NARAD_SECURITY_ALLOW_LEGACY_CLUSTER_AUTH")
    c = container(render("security.allowInsecureCluster=true"))
    eq(env_from(c)["NARAD_CLUSTER_SECRET"]["secretKeyRef"].get("optional"), None, "secret required with security on")
    # One node: none of it (the binary needs >= 3 peers or none).
    c = container(render(*ONE_NODE, "security.allowInsecureCluster=true"))
    eq(CLUSTER_ENV_NAMES & set(env_names(c)), set(), "cluster variables of a single node")
    eq(env_from(c)["NARAD_NODE_ID"], {"fieldRef": {"fieldPath": "metadata.name"}}, "single node's NARAD_NODE_ID")


@check
def env_names_are_read_by_this_binary():
    src = (ROOT / "src" / "config.rs").read_text() + (ROOT / "src" / "auth" / "seed.rs").read_text()
    known = set(re.findall(r'"(NARAD_[A-Z0-9_]+)"', src))
    assert "NARAD_HTTP_METRICS_ADDR" in known and "NARAD_ADMIN_PASSWORD" in known, "source scan found too little"
    renders = [
        render(),
        render("metrics.enabled=false", "security.enabled=false", "security.allowInsecureCluster=true", "security.allowLegacyClusterAuth=true"),
        render(values=[EVERYTHING]),
    ]
    seen = set()
    for objs in renders:
        (st,) = [o for k, o in objs.items() if k[0] == "StatefulSet"]
        for name in env_names(st["spec"]["template"]["spec"]["containers"][0]):
            seen.add(name)
            if name.startswith("NARAD_"):
                assert name in known, f"{name} is rendered but src/config.rs does not read it"
    eq(CLUSTER_ENV_NAMES - seen, set(), "cluster variables never rendered")


@check
def notes_name_the_service_pods_and_commands():
    with tempfile.TemporaryDirectory() as tmp:
        chart = pathlib.Path(tmp) / "narad"
        shutil.copytree(CHART, chart)
        # helm template skips NOTES.txt: render it through a wrapper template in a copy of the chart.
        shutil.copy(chart / "templates" / "NOTES.txt", chart / "notes-under-test.txt")
        (chart / "templates" / "zz-notes-under-test.yaml").write_text(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes-under-test}\n"
            'data:\n  notes: {{ tpl (.Files.Get "notes-under-test.txt") . | quote }}\n'
        )
        notes = render(chart=chart)[("ConfigMap", "notes-under-test")]["data"]["notes"]
        for want in [
            "http://narad.narad.svc.cluster.local:7942",
            "narad-0.narad-headless.narad.svc.cluster.local",
            "kubectl -n narad rollout status statefulset/narad",
            "kubectl -n narad port-forward svc/narad 7942:7942",
            "curl -s localhost:7942/healthz",
            "curl -s localhost:7942/readyz",
            "curl -s localhost:9100/metrics",
            "kubectl -n narad create secret generic narad-security --from-literal=cluster-secret=",
            "curl -s -u admin:<password> localhost:7942/v1/cluster/members",
            "kubectl -n narad exec narad-$i -- cat /var/lib/narad/admin-password",
            "then upgrade with --set replicaCount=N --set allowScaleInTo=N.",
            "kubectl -n narad logs job/narad-scalein-guard",
            'It signs in as "admin" with the key "admin-password" of Secret narad-security',
        ]:
            assert want in notes, f"NOTES.txt lacks {want!r}:\n{notes}"
        notes = render(*ONE_NODE, chart=chart)[("ConfigMap", "notes-under-test")]["data"]["notes"]
        for want in ["kubectl -n narad exec narad-0 -- cat /var/lib/narad/admin-password"]:
            assert want in notes, f"NOTES.txt (one node) lacks {want!r}:\n{notes}"
        for unwanted in ["create secret", "narad-1.", "/v1/cluster/members", "allowScaleInTo"]:
            assert unwanted not in notes, f"NOTES.txt (one node) has {unwanted!r}:\n{notes}"
        notes = render("metrics.enabled=false", "clusterDomain=k8s.internal", chart=chart)[("ConfigMap", "notes-under-test")]["data"]["notes"]
        for want in ["narad-0.narad-headless.narad.svc.k8s.internal", "localhost:7942/metrics"]:
            assert want in notes, f"NOTES.txt (metrics off) lacks {want!r}:\n{notes}"
        notes = render("scaleInGuard.credentialsSecret=g", chart=chart)[("ConfigMap", "notes-under-test")]["data"]["notes"]
        assert "logs job/narad-scalein-guard" in notes and "signs in" not in notes, f"NOTES.txt (credentialsSecret):\n{notes}"
        notes = render("scaleInGuard.enabled=false", chart=chart)[("ConfigMap", "notes-under-test")]["data"]["notes"]
        assert "allowScaleInTo=N" in notes and "scalein-guard" not in notes, f"NOTES.txt (guard off):\n{notes}"


# ---- The rendered pod command line against the real binary ----


def http_get(url, auth=None):
    req = urllib.request.Request(url)
    if auth:
        req.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=2) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def loopback(addr):
    """':7942' binds every interface in the pod; the test binds loopback only."""
    return "127.0.0.1" + addr if addr.startswith(":") else addr


def boot(sets=(), values=(), secret=None, set_json=()):
    """Runs the rendered container's command line and environment, resolving what the kubelet
    would (fieldRefs, $(POD_NAME), the Secret's keys from `secret`, the ConfigMap file) and moving
    /var/lib/narad to a temporary directory. Returns (objects, container, process, tmp dir, ports
    by container port name)."""
    api, cluster, metrics, pprof = free_ports(4)
    objs = render(
        *sets,
        f"service.ports.api={api}", f"service.ports.cluster={cluster}",
        f"service.ports.metrics={metrics}", f"service.ports.pprof={pprof}",
        values=values, set_json=set_json,
    )
    (st,) = [o for k, o in objs.items() if k[0] == "StatefulSet"]
    c = st["spec"]["template"]["spec"]["containers"][0]
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="narad-helm-"))
    data = tmp / "data"
    data.mkdir()
    args, pod_env = pod_command(st, 0, secret)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp)}
    for k, v in pod_env.items():
        env[k] = loopback(v) if k.endswith("_ADDR") else v
    resolved, args = args, []
    for a in resolved:
        if a == "--data-dir=/var/lib/narad":
            a = f"--data-dir={data}"
        elif a.startswith("--addr="):
            a = "--addr=" + loopback(a[len("--addr="):])
        elif a == "--config=/etc/narad/narad.json":
            (cm,) = [o for k, o in objs.items() if k[0] == "ConfigMap"]
            (tmp / "narad.json").write_text(cm["data"]["narad.json"])
            a = f"--config={tmp / 'narad.json'}"
        args.append(a)
    log = open(tmp / "log", "w")
    proc = subprocess.Popen([str(BIN)] + args, env=env, stdout=log, stderr=subprocess.STDOUT)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    deadline = time.monotonic() + BOOT_WAIT_S
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"narad exited with {proc.returncode}: {(tmp / 'log').read_text()[-2000:]}")
        try:
            if http_get(f"http://127.0.0.1:{api}/readyz")[0] == 200:
                break
        except OSError:
            pass
        if time.monotonic() > deadline:
            stop(proc)
            raise AssertionError(f"not ready after {BOOT_WAIT_S}s: {(tmp / 'log').read_text()[-2000:]}")
        time.sleep(0.1)
    return objs, c, proc, tmp, ports


def stop(proc):
    """SIGTERM, as the kubelet sends it; returns the exit status."""
    proc.terminate()
    try:
        return proc.wait(timeout=STOP_WAIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=STOP_WAIT_S)
        raise AssertionError(f"narad ignored SIGTERM for {STOP_WAIT_S}s")


def probe_and_scrape(objs, c, ports):
    """GETs each rendered probe on its port, and scrapes where the pod annotations point."""
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        g = c[probe]["httpGet"]
        status, body = http_get(f"http://127.0.0.1:{ports[g['port']]}{g['path']}")
        eq(status, 200, f"{probe} {g} answer ({body.strip()})")
    ann = next(o for k, o in objs.items() if k[0] == "StatefulSet")["spec"]["template"]["metadata"].get("annotations", {})
    if ann.get("prometheus.io/scrape") == "true":
        status, body = http_get(f"http://127.0.0.1:{ann['prometheus.io/port']}{ann['prometheus.io/path']}")
        eq(status, 200, "scrape status")
        assert re.search(r"^narad_", body, re.M), f"no narad_ series in the scrape: {body[:300]!r}"


def with_booted(fn, *args, **kwargs):
    objs, c, proc, tmp, ports = boot(*args, **kwargs)
    try:
        fn(objs, c, ports, tmp)
    finally:
        try:
            code = stop(proc)
        finally:
            log = (tmp / "log").read_text()
            shutil.rmtree(tmp, ignore_errors=True)
    eq(code, 0, f"exit status after SIGTERM (log tail: {log[-1000:]!r})")


@check
def default_pod_starts_the_binary():
    def run(objs, c, ports, tmp):
        probe_and_scrape(objs, c, ports)
        # Security on without the Secret's optional key: the broker generated the root password.
        pw = (tmp / "data" / "admin-password").read_text().strip()
        eq(http_get(f"http://127.0.0.1:{ports['api']}/v1/topics")[0], 401, "topics without credentials")
        eq(http_get(f"http://127.0.0.1:{ports['api']}/v1/topics", auth=f"admin:{pw}")[0], 200, "topics as admin")

    with_booted(run, sets=ONE_NODE)


@check
def everything_pod_starts_the_binary():
    def run(objs, c, ports, tmp):
        probe_and_scrape(objs, c, ports)
        assert not (tmp / "data" / "admin-password").exists(), "password generated although the Secret key was given"
        eq(http_get(f"http://127.0.0.1:{ports['api']}/v1/topics", auth="admin:from-the-secret")[0], 200, "topics as admin")

    with_booted(run, values=[EVERYTHING], secret={"admin-password": "from-the-secret"})


@check
def insecure_pod_without_metrics_starts_the_binary():
    def run(objs, c, ports, tmp):
        assert "metrics" not in ports, ports
        probe_and_scrape(objs, c, ports)
        eq(http_get(f"http://127.0.0.1:{ports['api']}/v1/topics")[0], 200, "topics without credentials")

    with_booted(run, sets=[*ONE_NODE, "metrics.enabled=false", "security.enabled=false"])


CLUSTER_SECRET = {"cluster-secret": "helm-test-cluster-secret", "admin-password": "helm-test-admin-pw"}


def pods_on_loopback(objs, tmp):
    """The rendered pods' command lines as processes on this machine: each pod's args and
    environment resolved as the kubelet would (pod_command, with CLUSTER_SECRET as the Secret),
    then what DNS and the pod network would give it replaced: every pod's headless name and
    cluster port becomes 127.0.0.1 and that pod's own cluster port, ':<port>' listen addresses
    become loopback ones on the pod's own ports, /var/lib/narad a directory under `tmp`. Returns
    [(pod name, argv, env, {container port name: local port})]."""
    st = sts(objs)
    c = container(objs)
    by_number = {}
    for p in c["ports"]:
        by_number.setdefault(p["containerPort"], p["name"])
    # The pods' DNS subdomain: the StatefulSet's headless Service, default clusterDomain.
    domain = f"{st['spec']['serviceName']}.{NS}.svc.cluster.local"
    cluster_port = {p["name"]: p["containerPort"] for p in c["ports"]}["cluster"]
    n = st["spec"]["replicas"]
    names = [f"{st['metadata']['name']}-{i}" for i in range(n)]
    free = iter(free_ports(len(names) * len(by_number)))
    local = {name: {pname: next(free) for pname in by_number.values()} for name in names}
    dns = {f"{name}.{domain}:{cluster_port}": f"127.0.0.1:{local[name]['cluster']}" for name in names}
    pods = []
    for i, name in enumerate(names):
        args, env = pod_command(st, i, CLUSTER_SECRET)
        ports = local[name]
        mine = {num: ports[pname] for num, pname in by_number.items()}
        for k, v in env.items():
            for host, addr in dns.items():
                v = v.replace(host, addr)
            if k.endswith("_ADDR") and v.startswith(":"):
                v = f"127.0.0.1:{mine[int(v[1:])]}"
            assert domain not in v, f"{name}: {k}={v} names a pod outside the StatefulSet"
            env[k] = v
        argv = [str(BIN)]
        for a in args:
            flag, _, v = a.partition("=")
            if a == "--data-dir=/var/lib/narad":
                a = f"--data-dir={tmp / name}"
            elif flag == "--addr" and v.startswith(":"):
                a = f"--addr=127.0.0.1:{mine[int(v[1:])]}"
            elif flag == "--cluster-port":
                # Listens on every interface, like the pod: security on then needs the chart's
                # NARAD_SECURITY_ALLOW_PLAINTEXT_RAFT (the binary exempts only a loopback address).
                a = f"--cluster-port={mine[int(v)]}"
            argv.append(a)
        env.update({"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp)})
        pods.append((name, argv, env, ports))
    return pods


def run_refused(argv, env, log, timeout=20):
    """Runs a command line that must stop at start-up; returns (exit status, output)."""
    with open(log, "w") as f:
        proc = subprocess.Popen(argv, env=env, stdout=f, stderr=subprocess.STDOUT)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=STOP_WAIT_S)
            raise AssertionError(f"still running after {timeout}s: {pathlib.Path(log).read_text()[-1000:]}")
    return code, pathlib.Path(log).read_text()


@check
def cluster_pod_needs_the_chart_switches():
    """The binary refuses a pod of the rendered cluster without the plaintext-Raft switch, and
    without the cluster secret: both variables the chart sets are needed."""
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="narad-helm-"))
    try:
        name, argv, env, _ = pods_on_loopback(render(), tmp)[0]
        for drop, message in [
            ("NARAD_SECURITY_ALLOW_PLAINTEXT_RAFT", "set security.allow_plaintext_raft (NARAD_SECURITY_ALLOW_PLAINTEXT_RAFT)"),
            ("NARAD_CLUSTER_SECRET", "NARAD_CLUSTER_SECRET is required when security is on and cluster.peers is set"),
        ]:
            code, out = run_refused(argv, {k: v for k, v in env.items() if k != drop}, tmp / f"{drop}.log")
            assert code != 0, f"{name} without {drop} exited 0: {out[-1000:]}"
            assert message in out, f"{name} without {drop}: expected {message!r} in {out[-1000:]!r}"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ---- The rendered scale-in guard Job's command line against a fake members endpoint ----


class FakeMembers:
    """A loopback HTTP server that answers every GET with `answer` (status, JSON-able body) and
    records (path, Authorization, X-Narad-Client) of each request; stopped on leaving `with`."""

    def __init__(self):
        self.answer = (200, {"members": []})
        self.requests = []
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                fake.requests.append((self.path, self.headers.get("Authorization"), self.headers.get("X-Narad-Client")))
                status, body = fake.answer
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=STOP_WAIT_S)


def member(node_id, draining=False, owned=0):
    """A member as GET /v1/cluster/members lists it (API.md §12.1)."""
    m = {
        "id": node_id, "addr": f"{node_id}.{HEADLESS}:7942", "status": "alive", "draining": draining,
        "owned_partitions": owned, "outbound_moves": 0, "voter": True, "leader": node_id.endswith("-0"),
        "heartbeat_age_seconds": 1,
    }
    if draining:
        m["decommission_blocked"] = [{"code": "move_target", "message": "moves in flight {1}"}]
    return m


def run_guard(objs, url, secret=None, env_over=None, timeout=30):
    """Runs the rendered guard container's command (/bin/sh -c <script>) as the kubelet would
    (the Secret's keys from `secret`; an absent optional key leaves the variable unset) with
    what DNS would give it replaced: the rendered NARAD_ADDR's host and port become `url`; the
    image's `narad` on PATH is the binary under test. Returns (exit status, stdout + stderr)."""
    c = guard_container(objs)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="narad-helm-guard-"))
    try:
        (tmp / "bin").mkdir()
        (tmp / "bin" / "narad").symlink_to(BIN.resolve())
        env = {"PATH": f"{tmp / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}", "HOME": str(tmp)}
        for e in c["env"]:
            if "value" in e:
                env[e["name"]] = e["value"]
                continue
            ref = e["valueFrom"]["secretKeyRef"]
            if secret and ref["key"] in secret:
                env[e["name"]] = secret[ref["key"]]
            else:
                assert ref.get("optional"), f"{e['name']}: required Secret key {ref['key']} absent"
        assert re.fullmatch(r"http://[a-z0-9.-]+:\d+", env["NARAD_ADDR"]), env["NARAD_ADDR"]
        env["NARAD_ADDR"] = url
        env.update(env_over or {})
        r = subprocess.run(c["command"], env=env, cwd=tmp, capture_output=True, text=True, timeout=timeout)
        return r.returncode, r.stdout + r.stderr
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@check
def scalein_guard_command_refuses_to_delete_listed_members():
    """The rendered Job's command with the real binary's CLI against a fake members endpoint:
    a to-be-deleted pod still listed refuses (exit status non-zero, naming it); none listed, or
    allowScaleInTo equal to the new size, lets the upgrade through; a refused or failed listing
    refuses too (fail closed), saying how to approve."""
    secret = {"admin-password": "guard-pw"}
    admin = "Basic " + base64.b64encode(b"admin:guard-pw").decode()
    three = render()
    # Pods narad-3 and narad-4 run (a five-pod peer list); the upgrade sets replicaCount 3.
    scale_in = render("replicaCount=3", "clusterPeerCount=5")
    approved = render("replicaCount=3", "clusterPeerCount=5", "allowScaleInTo=3")
    five = [member(f"narad-{i}", owned=3) for i in range(5)]
    five[3] = member("narad-3", draining=True, owned=2)
    with FakeMembers() as fake:
        fake.answer = (200, {"members": five[:3]})
        code, out = run_guard(three, fake.url, secret)
        eq(code, 0, f"three members, replicaCount 3 (output {out!r})")
        assert "narad-0 narad-1 narad-2" in out, out
        eq(fake.requests, [("/v1/cluster/members", admin, fake.requests[0][2])], "the guard's request")
        assert fake.requests[0][2], "no X-Narad-Client header"

        fake.answer = (200, {"members": five})
        code, out = run_guard(scale_in, fake.url, secret)
        assert code != 0, f"scale-in over listed members exited 0: {out}"
        assert "deletes the pods narad-3 narad-4, which the cluster still lists as members" in out, out
        assert "narad-3: status alive, draining, owns 2 partition(s)" in out, out
        assert "narad-4: status alive, not draining, owns 3 partition(s)" in out, out
        assert "--set replicaCount=3 --set allowScaleInTo=3" in out, out

        # Only this StatefulSet's pods at or above the new size count (numerically: narad-10).
        fake.answer = (200, {"members": five[:3] + [member("narad-10"), member("narad-extra-7"), member("other-4")]})
        code, out = run_guard(scale_in, fake.url, secret)
        assert code != 0, f"narad-10 listed, exited 0: {out}"
        assert "deletes the pods narad-10, which" in out, out

        fake.answer = (200, {"members": five[:3]})
        code, out = run_guard(scale_in, fake.url, secret)
        eq(code, 0, f"decommissioned pods no longer listed (output {out!r})")

        fake.answer = (200, {"members": five})
        fake.requests.clear()
        code, out = run_guard(approved, fake.url, secret)
        eq(code, 0, f"allowScaleInTo=3 (output {out!r})")
        assert "allowScaleInTo=3 approves replicaCount=3" in out, out
        eq(fake.requests, [], "requests with the scale-in approved")

        # Fail closed: 401/403 (no or a stale password), an answer without a member list.
        for status in (401, 403):
            fake.answer = (status, {"error": "nope"})
            code, out = run_guard(scale_in, fake.url)
            assert code != 0, f"HTTP {status} exited 0: {out}"
            for want in [f"(HTTP {status})", "scaleInGuard.credentialsSecret", "--set allowScaleInTo=3", "key admin-password of Secret narad-security"]:
                assert want in out, f"HTTP {status}: {want!r} not in {out!r}"
        fake.answer = (200, {"nodes": []})
        code, out = run_guard(three, fake.url, secret)
        assert code != 0 and "answered without a member list" in out, f"no member list: {code} {out}"
        fake.answer = (200, b"not json")
        code, out = run_guard(three, fake.url, secret)
        assert code != 0 and "could not list the members" in out, f"invalid JSON: {code} {out}"

        # Credentials from scaleInGuard.credentialsSecret; none with security off.
        fake.answer = (200, {"members": five[:3]})
        fake.requests.clear()
        code, out = run_guard(render("scaleInGuard.credentialsSecret=g"), fake.url, {"username": "ops", "password": "pw2"})
        eq(code, 0, f"credentialsSecret (output {out!r})")
        eq(fake.requests[0][1], "Basic " + base64.b64encode(b"ops:pw2").decode(), "credentialsSecret's Authorization")
        fake.requests.clear()
        code, out = run_guard(render("security.enabled=false"), fake.url)
        eq((code, fake.requests[0][1]), (0, None), f"security off: status, Authorization (output {out!r})")
    # No answer at all (the server is gone).
    code, out = run_guard(scale_in, fake.url, secret)
    assert code != 0, f"no server, exited 0: {out}"
    assert "could not list the members" in out and "--set allowScaleInTo=3" in out, out


@check
def default_pods_form_one_cluster():
    """The default render's three pods, started with the real binary on loopback (their headless
    names mapped to 127.0.0.1 and their own ports): all three become ready and every one lists the
    three pods as alive members, one leader, all voters; a topic created through one pod is seen
    by another. SIGTERM (then SIGKILL) ends all three whatever happens."""
    # Two shards a node, as the cluster tests run (the default is one per CPU, three times over).
    objs = render("extraEnv.NARAD_SHARDS=2")
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="narad-helm-cluster-"))
    procs = {}
    try:
        pods = pods_on_loopback(objs, tmp)
        eq([p[0] for p in pods], PODS, "pods")
        for name, argv, env, _ in pods:
            with open(tmp / f"{name}.log", "w") as log:
                procs[name] = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)

        def logs():
            return "\n".join(f"--- {n}:\n{(tmp / f'{n}.log').read_text()[-1500:]}" for n in procs)

        admin = f"admin:{CLUSTER_SECRET['admin-password']}"
        deadline = time.monotonic() + CLUSTER_WAIT_S
        views = {}
        while True:
            for name, proc in procs.items():
                if proc.poll() is not None:
                    raise AssertionError(f"{name} exited with {proc.returncode}\n{logs()}")
            try:
                ready = all(http_get(f"http://127.0.0.1:{ports['api']}/readyz")[0] == 200 for _, _, _, ports in pods)
                views = {}
                for name, _, _, ports in pods:
                    status, body = http_get(f"http://127.0.0.1:{ports['api']}/v1/cluster/members", auth=admin)
                    views[name] = json.loads(body)["members"] if status == 200 else body
                if ready and all(
                    isinstance(v, list) and len(v) == 3 and all(m["status"] == "alive" for m in v) and sum(m["leader"] for m in v) == 1
                    for v in views.values()
                ):
                    break
            except (OSError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"no 3-member cluster in {CLUSTER_WAIT_S}s: members {views}\n{logs()}")
            time.sleep(0.2)
        # A member's "addr" is the API address its pod listens on (http.addr): each id is its pod's.
        api_addr = {name: f"127.0.0.1:{ports['api']}" for name, _, _, ports in pods}
        for name, members in views.items():
            eq(sorted(m["id"] for m in members), PODS, f"member ids seen by {name} (node id = pod name)")
            for m in members:
                eq(m["addr"], api_addr[m["id"]], f"{name}'s view of {m['id']}: API address")
                eq(m["voter"], True, f"{name}'s view of {m['id']}: voter")
            eq({m["id"] for m in members if m["leader"]}, {m["id"] for m in views[PODS[0]] if m["leader"]}, f"leader seen by {name}")
        # The rendered probes on each pod's own ports.
        c = container(objs)
        for name, _, _, ports in pods:
            for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                g = c[probe]["httpGet"]
                status, body = http_get(f"http://127.0.0.1:{ports[g['port']]}{g['path']}")
                eq(status, 200, f"{name} {probe} {g} ({body.strip()})")
            # The root admin came from the Secret: no pod generated a password.
            assert not (tmp / name / "admin-password").exists(), f"{name} generated an admin password"
        # One metadata: a topic created through narad-0 is seen by narad-2.
        first, last = pods[0][3]["api"], pods[-1][3]["api"]
        req = urllib.request.Request(
            f"http://127.0.0.1:{first}/v1/topics", method="POST", data=b'{"name":"helm-chart","partitions":3}',
            headers={"Content-Type": "application/json", "Authorization": "Basic " + base64.b64encode(admin.encode()).decode()},
        )
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                status = r.status
        except urllib.error.HTTPError as e:
            status = e.code
        eq(status, 201, "create topic through narad-0")
        deadline = time.monotonic() + 10
        while http_get(f"http://127.0.0.1:{last}/v1/topics/helm-chart", auth=admin)[0] != 200:
            assert time.monotonic() < deadline, "narad-2 does not see the topic created through narad-0"
            time.sleep(0.1)
        # The rendered scale-in guard against the real members route: replicaCount 3 deletes no
        # member; 2 (which validate.yaml would not render here) would delete narad-2, a member.
        code, out = run_guard(objs, f"http://127.0.0.1:{first}", CLUSTER_SECRET)
        eq(code, 0, f"scale-in guard against the cluster (output {out!r})")
        assert "the members are narad-0 narad-1 narad-2:" in out, out
        code, out = run_guard(objs, f"http://127.0.0.1:{first}", CLUSTER_SECRET, {"SCALEIN_GUARD_REPLICAS": "2"})
        assert code != 0 and "deletes the pods narad-2, which" in out, f"guard with replicaCount 2: {code} {out}"
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.terminate()
        stuck = []
        for name, proc in procs.items():
            try:
                proc.wait(timeout=STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                stuck.append(name)
                proc.kill()
                proc.wait(timeout=STOP_WAIT_S)
        shutil.rmtree(tmp, ignore_errors=True)
    eq(stuck, [], "pods that ignored SIGTERM")
    eq({n: p.returncode for n, p in procs.items()}, {n: 0 for n in procs}, "exit statuses after SIGTERM")


def main():
    sys.stdout.reconfigure(line_buffering=True)
    # SIGTERM (timeout(1), CI cancelling) unwinds like an exception: the finally blocks stop the
    # brokers this started and remove their directories.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    print(f"chart {CHART}, binary {BIN}")
    if not BIN.exists():
        print(f"FAIL: {BIN} does not exist (cargo build --bin narad, or set NARAD_BIN)")
        return 1
    failed = 0
    for fn in CHECKS:
        t = time.monotonic()
        try:
            fn()
            print(f"ok   {fn.__name__} ({time.monotonic() - t:.1f}s)")
        except Exception as e:  # every check runs; each failure is reported
            failed += 1
            print(f"FAIL {fn.__name__}: {e}")
            if not isinstance(e, (AssertionError, RenderError)):
                traceback.print_exc(file=sys.stdout)
    print(f"{len(CHECKS) - failed}/{len(CHECKS)} checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
