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

#[test]
fn envoy_and_istio_examples_use_only_declared_descriptors() {
    let rules = load_path(&root().join("examples/rules"), LoadOptions::default()).unwrap();
    let (mut keys, mut values) = (HashSet::new(), HashSet::new());
    for d in rules.domains.values() {
        declared(&d.root, &mut keys, &mut values);
    }
    for file in [
        "examples/envoy/envoy.yaml",
        "examples/istio/envoyfilter.yaml",
        "examples/istio/service-entry.yaml",
    ] {
        let text = std::fs::read_to_string(root().join(file)).unwrap();
        for doc in text.split("\n---\n") {
            assert!(yaml::parse(doc).is_ok(), "{file} does not parse");
        }
        for domain in field_values(&text, "domain") {
            assert!(
                rules.domains.contains_key(&domain),
                "{file}: domain {domain} not in examples/rules"
            );
        }
        for key in field_values(&text, "descriptor_key") {
            assert!(
                keys.contains(&key),
                "{file}: descriptor_key {key} not declared in examples/rules"
            );
        }
        for value in field_values(&text, "descriptor_value") {
            assert!(
                values.contains(&value),
                "{file}: descriptor_value {value} not declared in examples/rules"
            );
        }
    }
    // The tenant header becomes the `tenant` key in both proxies.
    assert!(keys.contains("tenant"));
}
