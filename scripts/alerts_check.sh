#!/usr/bin/env bash
# `make test`: tollgate's Prometheus alerts and Grafana dashboard (charts/tollgate/files/).
#  1. promtool check rules on the plain rules file;
#  2. promtool test rules: the unit tests (every alert fires on its case, look-alikes do not);
#  3. the chart with prometheusRule.enabled and dashboard.enabled, rendered offline (Helm SDK):
#     the PrometheusRule's groups equal the plain file's, pass promtool check rules and the same
#     unit tests; the dashboard ConfigMap carries the JSON file unchanged with its labels and
#     annotations; with the default values neither object is rendered;
#  4. the dashboard: valid JSON, uid "tollgate", a ${datasource} Prometheus variable, and every
#     query parses (promtool check rules, with the Grafana variables substituted);
#  5. every tollgate_* metric name the alerts and the dashboard use is declared in
#     src/telemetry/mod.rs (a counter's _total, a histogram's _bucket/_sum/_count allowed).
# Needs promtool (Prometheus 2.x) and python3 with helm_python and PyYAML.
set -euo pipefail
cd "$(dirname "$0")/.."

FILES=charts/tollgate/files
command -v promtool >/dev/null || { echo "alerts-check: promtool not found (Prometheus 2.x, e.g. Debian's prometheus package)" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "alerts-check: promtool check rules $FILES/tollgate-alerts.yaml"
promtool check rules "$FILES/tollgate-alerts.yaml"

echo "alerts-check: promtool test rules $FILES/tollgate-alerts_test.yaml"
promtool test rules "$FILES/tollgate-alerts_test.yaml"

echo "alerts-check: chart render (prometheusRule.enabled, dashboard.enabled), dashboard queries, metric names"
python3 - "$tmp" <<'PY'
import json, os, re, sys
import helm_python as helm
import yaml

tmp = sys.argv[1]
chart_dir = "charts/tollgate"
files = os.path.join(chart_dir, "files")
failures = []


def expect(cond, what):
    if not cond:
        failures.append(what)


chart = helm.Chart.load(chart_dir)


def render(values):
    out = chart.render(values, name="tollgate", namespace="tollgate", is_install=True)
    docs = [d for path, text in out.items() if path.endswith((".yaml", ".yml")) for d in yaml.safe_load_all(text) if d]
    return {f"{d['kind']}/{d['metadata']['name']}": d for d in docs}


# Defaults: neither object (the CRD may not exist; Grafana may not run a sidecar).
default = render({})
expect(not any(k.startswith("PrometheusRule/") for k in default), f"PrometheusRule rendered by default: {sorted(default)}")
expect("ConfigMap/tollgate-dashboard" not in default, "dashboard ConfigMap rendered by default")

# Enabled, with the values passed explicitly (so this holds whatever values.yaml defaults are).
m = render({
    "prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
    "dashboard": {"enabled": True, "labels": {"grafana_dashboard": "1"}, "annotations": {"grafana_folder": "Rate limiting"}},
})
rule = m.get("PrometheusRule/tollgate")
expect(rule is not None, f"no PrometheusRule/tollgate: {sorted(m)}")
if rule:
    expect(rule["apiVersion"] == "monitoring.coreos.com/v1", f"PrometheusRule apiVersion: {rule['apiVersion']}")
    labels = rule["metadata"].get("labels") or {}
    expect(labels.get("release") == "kube-prometheus-stack", f"prometheusRule.labels not applied: {labels}")
    expect(labels.get("app.kubernetes.io/name") == "tollgate", f"chart labels missing: {labels}")
    with open(os.path.join(files, "tollgate-alerts.yaml")) as f:
        plain = yaml.safe_load(f)
    expect(rule["spec"]["groups"] == plain["groups"], "the PrometheusRule's groups differ from files/tollgate-alerts.yaml")
    # The rendered rules, as a plain file next to a copy of the unit tests.
    os.makedirs(os.path.join(tmp, "rendered"))
    with open(os.path.join(tmp, "rendered", "tollgate-alerts.yaml"), "w") as f:
        yaml.safe_dump({"groups": rule["spec"]["groups"]}, f, allow_unicode=True, sort_keys=False)
    with open(os.path.join(files, "tollgate-alerts_test.yaml")) as src, \
            open(os.path.join(tmp, "rendered", "tollgate-alerts_test.yaml"), "w") as dst:
        dst.write(src.read())

cm = m.get("ConfigMap/tollgate-dashboard")
expect(cm is not None, f"no ConfigMap/tollgate-dashboard: {sorted(m)}")
with open(os.path.join(files, "tollgate-dashboard.json")) as f:
    dash_text = f.read()
if cm:
    data = cm.get("data") or {}
    expect(list(data) == ["tollgate-dashboard.json"], f"dashboard ConfigMap keys: {list(data)}")
    expect(data.get("tollgate-dashboard.json", "").strip() == dash_text.strip(), "the ConfigMap's dashboard differs from files/tollgate-dashboard.json")
    expect((cm["metadata"].get("labels") or {}).get("grafana_dashboard") == "1", f"dashboard.labels not applied: {cm['metadata'].get('labels')}")
    expect((cm["metadata"].get("annotations") or {}).get("grafana_folder") == "Rate limiting", f"dashboard.annotations not applied: {cm['metadata'].get('annotations')}")

# The dashboard itself.
dash = json.loads(dash_text)
expect(dash.get("uid") == "tollgate", f"dashboard uid: {dash.get('uid')}")
variables = {v["name"]: v for v in dash.get("templating", {}).get("list", [])}
ds = variables.get("datasource") or {}
expect(ds.get("type") == "datasource" and ds.get("query") == "prometheus", f"no Prometheus datasource variable: {ds}")
exprs, ids, rows = [], set(), 0


def walk(panels):
    global rows
    for p in panels:
        rows += p.get("type") == "row"
        expect(p.get("id") not in ids, f"duplicate panel id {p.get('id')}")
        ids.add(p.get("id"))
        if p.get("type") != "row":
            expect((p.get("datasource") or {}).get("uid") == "${datasource}", f"panel {p.get('title')!r}: datasource is not ${{datasource}}")
            expect(p.get("targets"), f"panel {p.get('title')!r} has no query")
        for t in p.get("targets", []):
            expect((t.get("datasource") or {}).get("uid") == "${datasource}", f"panel {p.get('title')!r}: a target's datasource is not ${{datasource}}")
            exprs.append((p.get("title"), t["expr"]))
        walk(p.get("panels", []))


walk(dash.get("panels", []))
expect(len(exprs) > 0, "the dashboard has no queries")

# Every query parses: Grafana's variables replaced by what they expand to, as recording rules.
def grafana_to_promql(e):
    e = e.replace("$__rate_interval", "5m").replace("$__interval", "1m")
    return re.sub(r"\$\{?([A-Za-z_]\w*)\}?", ".*", e)


record = [{"record": f"dashboard:query_{i}", "expr": grafana_to_promql(e)} for i, (_, e) in enumerate(exprs)]
with open(os.path.join(tmp, "dashboard-queries.yaml"), "w") as f:
    yaml.safe_dump({"groups": [{"name": "dashboard", "rules": record}]}, f, sort_keys=False)

# Metric names: declared in src/telemetry/mod.rs (the Rust suite also checks them against /metrics).
with open("src/telemetry/mod.rs") as f:
    declared = set(re.findall(r'pub const \w+: &str = "(tollgate_\w+)";', f.read()))
expect(declared, "no metric names found in src/telemetry/mod.rs")


def base(name):
    for suffix in ("_total", "_bucket", "_count", "_sum"):
        if name.endswith(suffix) and name[: -len(suffix)] in declared:
            return name[: -len(suffix)]
    return name


used = {}
with open(os.path.join(files, "tollgate-alerts.yaml")) as f:
    for g in yaml.safe_load(f)["groups"]:
        for r in g["rules"]:
            for n in re.findall(r"\btollgate_\w+", r["expr"]):
                used.setdefault(n, set()).add(f"alert {r.get('alert') or r.get('record')}")
for title, e in exprs:
    for n in re.findall(r"\btollgate_\w+", e):
        used.setdefault(n, set()).add(f"panel {title!r}")
for v in variables.values():
    q = v.get("definition") or ""
    for n in re.findall(r"\btollgate_\w+", q if isinstance(q, str) else ""):
        used.setdefault(n, set()).add(f"variable {v['name']}")
for n, where in sorted(used.items()):
    expect(base(n) in declared, f"{n} (used by {', '.join(sorted(where))}) is not a metric of src/telemetry/mod.rs")

if failures:
    print("alerts-check: FAILED\n  " + "\n  ".join(failures))
    sys.exit(1)
print(f"alerts-check: chart ok (PrometheusRule = files/tollgate-alerts.yaml, dashboard ConfigMap = files/tollgate-dashboard.json, neither by default); "
      f"dashboard: {len(ids) - rows} panels in {rows} rows, {len(exprs)} queries; {len(used)} metric names, all in src/telemetry/mod.rs")
PY

echo "alerts-check: promtool check rules on the chart's rendered PrometheusRule"
promtool check rules "$tmp/rendered/tollgate-alerts.yaml"
echo "alerts-check: promtool test rules against the rendered PrometheusRule"
promtool test rules "$tmp/rendered/tollgate-alerts_test.yaml"
echo "alerts-check: promtool check rules on every dashboard query"
promtool check rules "$tmp/dashboard-queries.yaml"

echo "alerts-check: ok"
