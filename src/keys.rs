//! Store keys: which bytes name a bucket.
//!
//! `<prefix>{<domain>|<k1>=<v1>|<k2>=<v2>…|<limit id>}` — everything that identifies one
//! bucket sits inside one Redis Cluster hash tag (`{…}`), so all of a bucket's state lives in
//! one slot and a Lua script never fails with CROSSSLOT. The limit id names the algorithm, the
//! window in milliseconds and the limit's index on its descriptor, so changing an algorithm or
//! a window starts a fresh bucket instead of misreading the old one, and several limits on one
//! key never share state. Shard `i` of a hot key adds `|#i` inside the tag, spreading shards
//! over the cluster.
//!
//! Domain, keys and values are percent-escaped (`%`, `{`, `}`, `|`, `=`, `#` and control
//! bytes), so no value can close the tag, add a field or make two different descriptors
//! produce one key. A part longer than [`MAX_PART`] bytes after escaping is replaced by
//! `%#` and its SHA-1 (a form escaping never produces), so a key's size is bounded.

use std::fmt::Write;

use crate::rules::Rate;

/// Longest escaped domain, key or value kept verbatim in a store key.
pub const MAX_PART: usize = 64;

/// The `index` of a limit that Envoy supplied with the request (`RateLimitDescriptor.limit`):
/// its key says `ov<requests_per_unit>` instead of a position, so an override never shares a
/// bucket with the rules' limits on the same entries, nor with an override of another size.
pub const OVERRIDE_INDEX: usize = usize::MAX;

/// Builds the store key of one bucket.
///
/// `entries` are the descriptor's (key, value) pairs, with shared (`share_threshold`) values
/// already replaced by their pattern; `index` is the limit's position on its descriptor.
pub fn bucket_key<'a>(
    prefix: &str,
    domain: &str,
    entries: impl IntoIterator<Item = (&'a str, &'a str)>,
    rate: &Rate,
    index: usize,
    shard: Option<u32>,
) -> String {
    let mut key = String::with_capacity(prefix.len() + 64);
    key.push_str(prefix);
    key.push('{');
    push_part(&mut key, domain);
    for (k, v) in entries {
        key.push('|');
        push_part(&mut key, k);
        key.push('=');
        push_part(&mut key, v);
    }
    // Writing to a String cannot fail.
    let (tag, window) = (rate.algorithm.key_tag(), rate.window_ms());
    if index == OVERRIDE_INDEX {
        let _ = write!(key, "|{tag}:{window}:ov{}", rate.requests_per_unit);
    } else {
        let _ = write!(key, "|{tag}:{window}:{index}");
    }
    if let Some(i) = shard {
        let _ = write!(key, "|#{i}");
    }
    key.push('}');
    key
}

fn needs_escape(b: u8) -> bool {
    matches!(b, b'%' | b'{' | b'}' | b'|' | b'=' | b'#') || b < 0x20 || b == 0x7f
}

/// Appends `part` escaped, or its hash when the escaped form would be too long.
fn push_part(out: &mut String, part: &str) {
    let escaped_len: usize = part
        .bytes()
        .map(|b| if needs_escape(b) { 3 } else { 1 })
        .sum();
    if escaped_len > MAX_PART {
        out.push_str("%#");
        out.push_str(&sha1_smol::Sha1::from(part.as_bytes()).digest().to_string());
        return;
    }
    let mut start = 0;
    for (i, b) in part.bytes().enumerate() {
        if needs_escape(b) {
            out.push_str(&part[start..i]);
            let _ = write!(out, "%{b:02X}");
            start = i + 1;
        }
    }
    out.push_str(&part[start..]);
}

/// The Redis Cluster hash slot of a key (CRC16/XMODEM of its hash tag, modulo 16,384).
pub fn cluster_slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = bytes
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let close = bytes[open + 1..].iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &bytes[open + 1..open + 1 + close])
        })
        .unwrap_or(bytes);
    crc16(tagged) % 16_384
}

fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in data {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::rules::{Algorithm, Unit};

    fn rate(algorithm: Algorithm) -> Rate {
        Rate {
            requests_per_unit: 10,
            unit: Unit::Minute,
            unit_multiplier: 1,
            burst: 10,
            algorithm,
        }
    }

    fn key(entries: &[(&str, &str)]) -> String {
        bucket_key(
            "tg:",
            "dom",
            entries.iter().copied(),
            &rate(Algorithm::TokenBucket),
            0,
            None,
        )
    }

    #[test]
    fn layout_is_prefix_then_one_tag() {
        assert_eq!(
            key(&[("tenant", "acme")]),
            "tg:{dom|tenant=acme|tb:60000:0}"
        );
        let fw = bucket_key(
            "",
            "d",
            [("k", "v")],
            &rate(Algorithm::FixedWindow),
            2,
            Some(3),
        );
        assert_eq!(fw, "{d|k=v|fw:60000:2|#3}");
        let sw = bucket_key(
            "",
            "d",
            [("k", "v")],
            &rate(Algorithm::SlidingWindow),
            0,
            None,
        );
        assert_eq!(sw, "{d|k=v|sw:60000:0}");
    }

    #[test]
    fn overrides_get_their_own_buckets() {
        let r = rate(Algorithm::TokenBucket);
        let rule = bucket_key("", "d", [("k", "v")], &r, 0, None);
        let ov = bucket_key("", "d", [("k", "v")], &r, OVERRIDE_INDEX, None);
        assert_eq!(ov, "{d|k=v|tb:60000:ov10}");
        assert_ne!(rule, ov);
        let bigger = Rate {
            requests_per_unit: 20,
            ..r
        };
        assert_ne!(
            ov,
            bucket_key("", "d", [("k", "v")], &bigger, OVERRIDE_INDEX, None)
        );
    }

    #[test]
    fn separators_and_braces_cannot_break_the_tag() {
        let k = key(&[("a", "x}y{z|w=v#%\n")]);
        assert_eq!(k, "tg:{dom|a=x%7Dy%7Bz%7Cw%3Dv%23%25%0A|tb:60000:0}");
        assert_eq!(k.matches('{').count(), 1);
        assert_eq!(k.matches('}').count(), 1);
    }

    #[test]
    fn long_values_are_hashed_and_bounded() {
        let long = "x".repeat(100_000);
        let k = key(&[("a", &long)]);
        assert!(k.len() < 100, "{k}");
        assert!(k.contains("%#"));
        assert_ne!(k, key(&[("a", &"x".repeat(99_999))]));
        // Exactly at the cap stays verbatim.
        assert!(key(&[("a", &"y".repeat(MAX_PART))]).contains(&"y".repeat(MAX_PART)));
    }

    #[test]
    fn slot_follows_the_hash_tag() {
        // Known values from the Redis Cluster specification's examples.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(
            cluster_slot("{user1000}.following"),
            cluster_slot("{user1000}.followers")
        );
        assert_eq!(cluster_slot("foo{}{bar}"), cluster_slot("foo{}{bar}"));
        assert_eq!(cluster_slot("foo{}{bar}"), crc16(b"foo{}{bar}") % 16_384);
        assert_eq!(cluster_slot("foo{{bar}}zap"), crc16(b"{bar") % 16_384);
    }

    /// A small deterministic generator (no extra dependency) for the property tests.
    fn values(seed: u64, n: usize) -> Vec<String> {
        const ALPHABET: &[char] = &[
            'a', '%', '{', '}', '|', '=', '#', '\\', '0', 'F', '\n', 'é', '2', '5', '7',
        ];
        let mut x = seed;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let len = (x % 7) as usize;
                (0..len)
                    .map(|i| ALPHABET[((x >> (i * 5)) % ALPHABET.len() as u64) as usize])
                    .collect()
            })
            .collect()
    }

    #[test]
    fn property_distinct_descriptors_never_share_a_key() {
        let vals = values(0x9E37_79B9_7F4A_7C15, 3000);
        let mut seen: HashSet<(String, String)> = HashSet::new();
        let mut keys: HashSet<String> = HashSet::new();
        for pair in vals.chunks(2) {
            let (a, b) = (pair[0].clone(), pair.get(1).cloned().unwrap_or_default());
            if seen.insert((a.clone(), b.clone())) {
                let k = key(&[("k", &a), ("j", &b)]);
                assert!(keys.insert(k.clone()), "collision for {a:?},{b:?}: {k}");
            }
        }
        // Moving a separator between key and value must change the key too.
        assert_ne!(key(&[("a=b", "c")]), key(&[("a", "b=c")]));
        assert_ne!(key(&[("a", "b|c=d")]), key(&[("a", "b"), ("c", "d")]));
    }

    #[test]
    fn property_all_shards_and_limits_of_a_bucket_keep_one_tag_each() {
        for v in values(42, 500) {
            let k = key(&[("k", &v)]);
            let open = k.find('{').unwrap();
            let close = k.find('}').unwrap();
            assert_eq!(close, k.len() - 1, "the tag must run to the end: {k}");
            assert!(open < close);
            // The hash slot is the tag's: recompute from the tag alone.
            assert_eq!(
                cluster_slot(&k),
                crc16(&k.as_bytes()[open + 1..close]) % 16_384
            );
        }
    }
}
