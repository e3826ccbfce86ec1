//! Key encoding on arbitrary domains, keys and values: two different descriptors never share
//! a store key, every key keeps its one hash tag, and its size stays bounded.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate::keys::bucket_key;
use tollgate::rules::{Algorithm, Rate, Unit};

type Descriptor = (String, Vec<(String, String)>);

fn key((domain, entries): &Descriptor) -> String {
    let rate = Rate {
        requests_per_unit: 10,
        unit: Unit::Minute,
        unit_multiplier: 1,
        burst: 10,
        algorithm: Algorithm::TokenBucket,
    };
    bucket_key(
        "tg:",
        domain,
        entries.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        &rate,
        0,
        None,
    )
}

fuzz_target!(|pair: (Descriptor, Descriptor)| {
    let (a, b) = (key(&pair.0), key(&pair.1));
    if pair.0 != pair.1 {
        assert_ne!(
            a, b,
            "two descriptors share a key: {:?} / {:?}",
            pair.0, pair.1
        );
    }
    for k in [&a, &b] {
        // One tag: the first `{` and the last `}` enclose everything but the prefix.
        assert_eq!(k.matches('{').count(), 1, "{k}");
        assert_eq!(k.matches('}').count(), 1, "{k}");
    }
    // A part longer than 64 bytes is hashed: the key grows with the number of parts, not
    // with their length.
    let parts = 1 + 2 * pair.0.1.len();
    assert!(
        a.len() <= 64 + parts * (3 * 64 + 2),
        "{} bytes for {parts} parts",
        a.len()
    );
});
