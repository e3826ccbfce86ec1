//! The examples stay true to each other: the Envoy and Istio configs parse, and every domain,
//! descriptor key and value they send exists in examples/rules/ (the rules `make run` serves).

use std::collections::HashSet;
use std::path::Path;

use tollgate::rules::model::Level;
use tollgate::rules::{LoadOptions, load_path, yaml};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Every `key` and `value` declared anywhere in a level.
fn declared(level: &Level, keys: &mut HashSet<String>, values: &mut HashSet<String>) {
    let nodes = level
        .exact
        .values()
        .flat_map(|m| m.values())
        .chain(level.wildcard.iter().map(|(_, _, d)| d))
        .chain(level.bare.values());
    for d in nodes {
        keys.insert(d.key.clone());
        if let Some(v) = &d.value {
            values.insert(v.clone());
        }
        declared(&d.children, keys, values);
    }
}

/// The values of `field: value` lines (flow or block style) in a YAML text.
fn field_values(text: &str, field: &str) -> Vec<String> {
    let needle = format!("{field}: ");
    text.match_indices(&needle)
        .map(|(at, _)| {
            text[at + needle.len()..]
                .split([',', '}', '\n'])
                .next()
                .unwrap_or("")
                .trim()
                .to_string()
        })
        .collect()
}

/// What each example must at least name, so the checks below cannot pass on a file whose text
/// they no longer find (`field_values` finding nothing would otherwise check nothing).
struct Expected {
    file: &'static str,
    domains: &'static [&'static str],
    keys: &'static [&'static str],
    values: &'static [&'static str],
    /// A `field: value` pointing at tollgate's default gRPC port (`{port}` is replaced).
    port: (&'static str, &'static str),
}

const EXAMPLES: &[Expected] = &[
    Expected {
        file: "examples/envoy/envoy.yaml",
        domains: &["edge"],
        keys: &["tenant", "endpoint", "downstream"],
        values: &["/search", "/export", "payments", "search-index"],
        port: ("port_value", "{port}"),
    },
    Expected {
        file: "examples/istio/envoyfilter.yaml",
        domains: &["edge"],
        keys: &["tenant", "endpoint", "downstream"],
        values: &["/search", "/export", "payments"],
        port: (
            "cluster_name",
            "outbound|{port}||tollgate.tollgate.svc.cluster.local",
        ),
    },
    // No descriptors here: it only gives the gateway a route to tollgate's gRPC port.
    Expected {
        file: "examples/istio/service-entry.yaml",
        domains: &[],
        keys: &[],
        values: &[],
        port: ("number", "{port}"),
    },
];

#[test]
fn envoy_and_istio_examples_use_only_declared_descriptors() {
    let rules = load_path(&root().join("examples/rules"), LoadOptions::default()).unwrap();
    let (mut keys, mut values) = (HashSet::new(), HashSet::new());
    for d in rules.domains.values() {
        declared(&d.root, &mut keys, &mut values);
    }
    assert!(
        rules.domains.contains_key("edge"),
        "examples/rules serve `edge`"
    );
    let grpc_port = tollgate::settings::Settings::default()
        .grpc_addr
        .port()
        .to_string();
    for expected in EXAMPLES {
        let file = expected.file;
        let text = std::fs::read_to_string(root().join(file)).unwrap();
        let docs: Vec<&str> = text.split("\n---\n").collect();
        for doc in &docs {
            assert!(
                matches!(yaml::parse(doc), Ok(Some(_))),
                "{file} does not parse, or has an empty document"
            );
        }
        let found =
            |field: &str| -> HashSet<String> { field_values(&text, field).into_iter().collect() };
        let (found_domains, found_keys, found_values) = (
            found("domain"),
            found("descriptor_key"),
            found("descriptor_value"),
        );
        for (what, want, got) in [
            ("domain", expected.domains, &found_domains),
            ("descriptor_key", expected.keys, &found_keys),
            ("descriptor_value", expected.values, &found_values),
        ] {
            for w in want {
                assert!(
                    got.contains(*w),
                    "{file}: no `{what}: {w}` found (found {got:?})"
                );
            }
        }
        let (field, value) = expected.port;
        let value = value.replace("{port}", &grpc_port);
        assert!(
            found(field).contains(&value),
            "{file}: no `{field}: {value}` (tollgate's default gRPC port)"
        );

        for domain in &found_domains {
            assert!(
                rules.domains.contains_key(domain),
                "{file}: domain {domain} not in examples/rules"
            );
        }
        for key in &found_keys {
            assert!(
                keys.contains(key),
                "{file}: descriptor_key {key} not declared in examples/rules"
            );
        }
        for value in &found_values {
            assert!(
                values.contains(value),
                "{file}: descriptor_value {value} not declared in examples/rules"
            );
        }
    }
    // The tenant header becomes the `tenant` key in both proxies.
    assert!(keys.contains("tenant"));
}
