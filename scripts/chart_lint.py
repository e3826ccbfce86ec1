#!/usr/bin/env python3
"""`make chart-lint`: lint and render charts/tollgate offline (Helm v4 SDK from PyPI
`helm-python-sdk`; no cluster, no helm binary), check the rendered manifests, and validate
the example values' rules with `tollgate check`."""
import os
import subprocess
import sys
import tempfile

import helm_python as helm
import yaml

CHART = os.path.join(os.path.dirname(__file__), "..", "charts", "tollgate")
failures = []


def expect(cond, what):
    if not cond:
        failures.append(what)


report = helm.lint(CHART, strict=True)
for m in report.get("messages", []):
    if m.get("severity", 0) >= 2:
        failures.append(f"lint: {m.get('path')}: {m.get('error')}")
for e in report.get("errors") or []:
    failures.append(f"lint: {e}")

chart = helm.Chart.load(CHART)


def render(values):
    out = chart.render(values, name="tollgate", namespace="tollgate", is_install=True)
    docs = []
    for path, text in out.items():
        for doc in yaml.safe_load_all(text):
            if doc:
                docs.append(doc)
    return {f"{d['kind']}/{d['metadata']['name']}": d for d in docs}


# Defaults: memory store, one replica, no rules, the names the Istio example expects.
m = render({})
expect("Service/tollgate" in m, f"Service/tollgate missing: {sorted(m)}")
expect("Deployment/tollgate" in m, "Deployment missing")
svc = m["Service/tollgate"]
expect([p["port"] for p in svc["spec"]["ports"]] == [8081, 8080], "service ports")
pod = m["Deployment/tollgate"]["spec"]["template"]["spec"]
env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
expect(env.get("TOLLGATE_STORE") == "memory", f"store env: {env}")
expect(env.get("TOLLGATE_RULES") == "/etc/tollgate/rules", "rules env")
expect(env.get("TOLLGATE_UNREADY_WITHOUT_RULES") == "true", f"unready without rules: {env}")
expect(env.get("TOLLGATE_GRPC_MAX_CONNECTION_AGE_MS") == "300000", f"connection age: {env}")
expect(not (m["ConfigMap/tollgate-rules"].get("data") or {}), "the default values ship no active rules")
expect(m["Deployment/tollgate"]["spec"]["replicas"] == 1, "one replica by default")
expect("PodDisruptionBudget/tollgate" not in m, "no PDB that would block drains of a single replica")

# The "restricted" Pod Security Standard, pod and container level.
psc = pod.get("securityContext") or {}
expect(psc.get("runAsNonRoot") is True, f"pod runAsNonRoot: {psc}")
expect((psc.get("seccompProfile") or {}).get("type") == "RuntimeDefault", f"pod seccompProfile: {psc}")
for c in pod["containers"]:
    sc = c.get("securityContext") or {}
    expect(sc.get("allowPrivilegeEscalation") is False, f"{c['name']}: allowPrivilegeEscalation: {sc}")
    expect(sc.get("runAsNonRoot") is True or psc.get("runAsNonRoot") is True, f"{c['name']}: runAsNonRoot")
    expect((sc.get("capabilities") or {}).get("drop") == ["ALL"], f"{c['name']}: capabilities: {sc}")
    expect((sc.get("seccompProfile") or {}).get("type") in ("RuntimeDefault", "Localhost"), f"{c['name']}: seccompProfile: {sc}")
    expect(sc.get("runAsUser", 1) != 0, f"{c['name']}: runs as root")

# More than one replica on the memory store is refused with a message, unless acknowledged.
try:
    render({"replicaCount": 2})
    failures.append("memory store with 2 replicas rendered; expected a fail")
except Exception as e:  # the SDK raises the template's `fail` message
    expect("memory" in str(e) and "allowMemoryStoreWithReplicas" in str(e), f"fail message: {e}")
ack = render({"replicaCount": 2, "allowMemoryStoreWithReplicas": True})
expect(ack["Deployment/tollgate"]["spec"]["replicas"] == 2, "acknowledged memory replicas")
expect("PodDisruptionBudget/tollgate" in ack, "PDB with two replicas")

# A user's rules replace the (empty) defaults: only their domain goes live.
mine = render({"store": "redis://r:6379", "replicaCount": 3, "rules": {"mine.yaml": "domain: mine\n"}})
expect(mine["ConfigMap/tollgate-rules"]["data"] == {"mine.yaml": "domain: mine\n"}, f"rules: {mine['ConfigMap/tollgate-rules']['data']}")

# The example values file renders and its rules load.
with open(os.path.join(CHART, "values-example.yaml")) as f:
    example = yaml.safe_load(f)
rules = render(example)["ConfigMap/tollgate-rules"]["data"]
expect("edge.yaml" in rules, f"example rules: {rules}")

# Redis store, extra settings, existing rules ConfigMap, ServiceMonitor.
m2 = render({
    "store": "redis+cluster://r1:6379,r2:6379",
    "settings": {"store_timeout_ms": 10, "response_headers": True},
    "existingRulesConfigMap": "my-rules",
    "serviceMonitor": {"enabled": True},
})
c = m2["Deployment/tollgate"]["spec"]["template"]["spec"]
env2 = {e["name"]: e.get("value") for e in c["containers"][0]["env"]}
expect(env2.get("TOLLGATE_STORE_TIMEOUT_MS") == "10", f"settings env: {env2}")
expect(env2.get("TOLLGATE_RESPONSE_HEADERS") == "true", f"settings env: {env2}")
expect(c["volumes"][0]["configMap"]["name"] == "my-rules", "existing rules ConfigMap")
expect("ConfigMap/tollgate-rules" not in m2, "no rules ConfigMap with an existing one")
expect("ServiceMonitor/tollgate" in m2, "ServiceMonitor")

# The example's rules must load.
tollgate = os.environ.get("TOLLGATE_BIN", os.path.join(os.path.dirname(__file__), "..", "target", "debug", "tollgate"))
with tempfile.TemporaryDirectory() as d:
    for name, text in rules.items():
        with open(os.path.join(d, name), "w") as f:
            f.write(text)
    r = subprocess.run([tollgate, "check", d], capture_output=True, text=True)
    expect(r.returncode == 0, f"chart rules: {r.stdout}{r.stderr}")

if failures:
    print("chart-lint: FAILED\n  " + "\n  ".join(failures))
    sys.exit(1)
print(f"chart-lint: ok ({report.get('total_charts_linted')} chart linted strict, {len(m)} + {len(m2)} manifests rendered and checked)")
