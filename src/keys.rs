//! Store keys: which bytes name a bucket.
//!
//! `<prefix>{<domain>|<k1>=<v1>|<k2>=<v2>…|<limit id>}` — everything that identifies one
//! bucket sits inside one Redis Cluster hash tag (`{…}`), so all of a bucket's state lives in
//! one slot and a Lua script never fails with CROSSSLOT. The limit id names the limit by what
//! its state means (`Rate::identity`): `<algorithm>:<window ms>:<n>`, `<n>` counting (from 0)
//! the limits before it on its descriptor with the same algorithm and window (almost always
//! 0: the key 0.1.0 wrote for a descriptor's first limit). A calendar window is
//! `cw:<unit>[±<offset minutes>]:<n>`. The limit's numbers (`requests_per_unit`, `burst`) are
//! not in the key: they travel with each call, and an edit of them keeps the bucket and what
//! it spent (`quota/bucket/`: a token bucket records the capacity it counted against, a
//! window compares its count with the new limit; docs/rules.md, "What a rules edit keeps").
//! An edit of the algorithm or the window starts a fresh bucket instead of misreading the old
//! one; inserting, removing or reordering other limits keeps every limit's bucket; several
//! limits on one key never share state. Shard `i` of a hot key adds `|#i` inside the tag,
//! spreading shards over the cluster, and a numbers edit keeps the key's slot.
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
/// its key says `ov` instead of a number, so an override never shares a bucket with the rules'
/// limits on the same entries; overrides of any size on one descriptor share one (an override
/// that changes keeps what was spent, as a rules edit does).
pub const OVERRIDE_INDEX: usize = usize::MAX;

/// Builds the store key of one bucket.
///
/// `entries` are the descriptor's (key, value) pairs, with shared (`share_threshold`) values
/// already replaced by their pattern; `index` counts the limits before this one on its
/// descriptor with the same algorithm and window (`Limit::index`, almost always 0).
///
/// `shard`: `Some(i)` names sub-bucket `i` of a limit declared with `shards:`
/// (`limiter/shard.rs`), inside the tag so shards spread over the cluster's slots.
pub fn bucket_key<'a>(
    prefix: &str,
    domain: &str,
    entries: impl IntoIterator<Item = (&'a str, &'a str)>,
    rate: &Rate,
    index: usize,
    shard: Option<u32>,
) -> String {
    let mut key = descriptor_part(prefix, domain, entries);
    // The limit's part, `|<tag>:<window ms>:<n>` or `|<tag>:<window ms>:ov`, with the digits
    // written by hand: this runs for every descriptor of every request, and `write!`'s
    // formatting machinery cost as much as the rest of the key. A calendar window is
    // `|cw:<unit>[±<offset minutes>]:<n>` (`|cw:month:0`, `|cw:day+540:0`): never a plain
    // fixed window's bucket, and one per calendar.
    key.push('|');
    match rate.calendar {
        None => {
            key.push_str(rate.algorithm.key_tag());
            key.push(':');
            push_u64(&mut key, rate.window_ms());
        }
        Some(c) => {
            key.push_str("cw:");
            key.push_str(rate.unit.name());
            if c.offset_min != 0 {
                key.push(if c.offset_min < 0 { '-' } else { '+' });
                push_u64(&mut key, u64::from(c.offset_min.unsigned_abs()));
            }
        }
    }
    key.push(':');
    if index == OVERRIDE_INDEX {
        key.push_str("ov");
    } else {
        push_u64(&mut key, index as u64);
    }
    if let Some(i) = shard {
        key.push_str("|#");
        push_u64(&mut key, u64::from(i));
    }
    key.push('}');
    key
}

/// The key up to the limit's part: the prefix, the tag's opening brace, the domain and the
/// escaped entries.
fn descriptor_part<'a>(
    prefix: &str,
    domain: &str,
    entries: impl IntoIterator<Item = (&'a str, &'a str)>,
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
    key
}

/// Appends `n` in decimal, as `write!(out, "{n}")` does.
fn push_u64(out: &mut String, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    // ASCII digits are always valid UTF-8: the `unwrap_or` never applies.
    out.push_str(std::str::from_utf8(&digits[at..]).unwrap_or_default());
}

/// The key of shard `to` of the same bucket as the shard key `key` (one [`bucket_key`] built
/// with `Some(i)`): the shard part is always last in the tag, and `|` and `#` in a domain,
/// key or value are escaped, so the last `|#` starts it.
pub fn with_shard(key: &str, to: u32) -> String {
    let mut out = String::with_capacity(key.len() + 4);
    out.push_str(bucket_id(key));
    let _ = write!(out, "|#{to}}}");
    out
}

/// What names a bucket whichever of its shards a key is: a shard key without its shard part
/// (and without the closing brace); any other key whole. Leases are kept per bucket by it.
pub fn bucket_id(key: &str) -> &str {
    match key.rfind("|#") {
        Some(at) if key.ends_with('}') => &key[..at],
        _ => key,
    }
}

fn needs_escape(b: u8) -> bool {
    matches!(b, b'%' | b'{' | b'}' | b'|' | b'=' | b'#') || b < 0x20 || b == 0x7f
}

/// Appends `part` escaped, or its hash when the escaped form would be too long.
fn push_part(out: &mut String, part: &str) {
    // The common case, nothing to escape and short enough: one pass, one copy.
    if part.len() <= MAX_PART && !part.bytes().any(needs_escape) {
        out.push_str(part);
        return;
    }
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

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use proptest::prelude::*;
    use redis::cluster_routing::Slot;

    use super::*;
    use crate::rules::{Algorithm, Unit};

    fn rate(algorithm: Algorithm) -> Rate {
        Rate {
            requests_per_unit: 10,
            unit: Unit::Minute,
            unit_multiplier: 1,
            burst: 10,
            algorithm,
            calendar: None,
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
    fn shard_keys_differ_only_in_the_shard_part() {
        let r = rate(Algorithm::TokenBucket);
        let k2 = bucket_key("p|#:", "d|#x", [("k", "v#|")], &r, 0, Some(2));
        let k5 = bucket_key("p|#:", "d|#x", [("k", "v#|")], &r, 0, Some(5));
        assert_eq!(with_shard(&k2, 5), k5);
        assert_eq!(bucket_id(&k2), bucket_id(&k5));
        assert_eq!(format!("{}|#2}}", bucket_id(&k2)), k2);
        let plain = bucket_key("p:", "d", [("k", "v")], &r, 0, None);
        assert_eq!(bucket_id(&plain), plain);
        assert_ne!(Slot::for_key(k2.as_bytes()), Slot::for_key(k5.as_bytes()));
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
        assert_eq!(
            fw, "{d|k=v|fw:60000:2|#3}",
            "the third fixed window of a minute on this descriptor"
        );
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
    fn a_limit_is_named_by_its_algorithm_and_window_not_its_numbers() {
        let r = rate(Algorithm::TokenBucket);
        let k = |r: &Rate, index| bucket_key("", "d", [("k", "v")], r, index, None);
        let base = k(&r, 0);
        assert_ne!(base, k(&r, 1), "two limits alike in algorithm and window");
        for edited in [
            Rate {
                requests_per_unit: 11,
                ..r
            },
            Rate { burst: 20, ..r },
            Rate {
                requests_per_unit: 1,
                burst: 1_000,
                ..r
            },
        ] {
            let key = k(&edited, 0);
            assert_eq!(base, key, "{edited:?} keeps its bucket");
            assert_eq!(
                Slot::for_key(base.as_bytes()),
                Slot::for_key(key.as_bytes())
            );
        }
        for changed in [
            Rate {
                unit_multiplier: 2,
                ..r
            },
            Rate {
                algorithm: Algorithm::FixedWindow,
                ..r
            },
            Rate {
                unit: Unit::Hour,
                ..r
            },
        ] {
            assert_ne!(base, k(&changed, 0), "{changed:?} starts a fresh bucket");
        }
        assert_eq!(base, "{d|k=v|tb:60000:0}", "0.1.0's key of a first limit");
    }

    #[test]
    fn overrides_get_their_own_buckets() {
        let r = rate(Algorithm::TokenBucket);
        let rule = bucket_key("", "d", [("k", "v")], &r, 0, None);
        let ov = bucket_key("", "d", [("k", "v")], &r, OVERRIDE_INDEX, None);
        assert_eq!(ov, "{d|k=v|tb:60000:ov}");
        assert_ne!(rule, ov);
        let bigger = Rate {
            requests_per_unit: 20,
            ..r
        };
        assert_eq!(
            ov,
            bucket_key("", "d", [("k", "v")], &bigger, OVERRIDE_INDEX, None),
            "an override that changes keeps what was spent"
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
        // The store groups a cluster request's ops by `Slot::for_key`: what it computes for
        // our keys is the tag's slot, as the Redis Cluster specification says.
        let slot = Slot::for_key;
        assert_eq!(slot("{user1000}.following"), slot("{user1000}.followers"));
        // An empty first tag means no tag: the whole key is hashed, not the later `{bar}`.
        assert_ne!(slot("foo{}{bar}"), slot("bar"));
        // The tag runs from the first `{` to the first `}` after it.
        assert_eq!(slot("foo{{bar}}zap"), slot("{bar"));
        // `CLUSTER KEYSLOT` answers from the Redis documentation.
        assert_eq!(Some(slot("somekey")), Slot::new(11_058));
        assert_eq!(Some(slot("foo")), Slot::new(12_182));
        let k = key(&[("tenant", "a")]);
        let tag = &k[k.find('{').unwrap() + 1..k.len() - 1];
        assert_eq!(slot(&k), slot(tag));
    }

    #[test]
    fn moving_a_separator_changes_the_key() {
        assert_ne!(key(&[("a=b", "c")]), key(&[("a", "b=c")]));
        assert_ne!(key(&[("a", "b|c=d")]), key(&[("a", "b"), ("c", "d")]));
    }

    /// Domains, keys and values over an alphabet rich in the characters the key layout uses
    /// (`%{}|=#`), escapes and their hex digits, control and non-ASCII characters; long enough
    /// now and then to be hashed instead of escaped.
    fn part() -> impl Strategy<Value = String> {
        const ALPHABET: &[char] = &[
            'a', 'b', '%', '{', '}', '|', '=', '#', '\\', ':', '0', '2', '3', '5', '7', 'C', 'D',
            'F', '\n', '\r', '\0', ' ', 'é', '€', '😀',
        ];
        prop_oneof![
            8 => prop::collection::vec(prop::sample::select(ALPHABET), 0..8),
            1 => prop::collection::vec(prop::sample::select(ALPHABET), 20..40),
        ]
        .prop_map(|chars| chars.into_iter().collect())
    }

    fn entries() -> impl Strategy<Value = Vec<(String, String)>> {
        prop::collection::vec((part(), part()), 0..4)
    }

    /// `entries` with the first character that needs escaping in part `at` (modulo the number
    /// of parts) replaced by the text of its escape: `=` becomes the three characters `%3D`.
    fn spelled_as_escape(entries: &[(String, String)], at: usize) -> Vec<(String, String)> {
        let mut out = entries.to_vec();
        if out.is_empty() {
            return out;
        }
        let n = out.len();
        let (k, v) = &mut out[at / 2 % n];
        let part = if at.is_multiple_of(2) { k } else { v };
        if let Some(i) = part.bytes().position(needs_escape) {
            // Every byte that needs escaping is ASCII, so `i..=i` is one whole character.
            let escape = format!("%{:02X}", part.as_bytes()[i]);
            part.replace_range(i..=i, &escape);
        }
        out
    }

    /// One part read back from a key.
    #[derive(Debug)]
    enum Read {
        Verbatim(String),
        /// `%#` and the SHA-1 hex of the original.
        Hashed(String),
    }

    impl Read {
        fn is(&self, original: &str) -> bool {
            match self {
                Read::Verbatim(s) => s == original,
                Read::Hashed(h) => *h == sha1_smol::Sha1::from(original).digest().to_string(),
            }
        }
    }

    /// Reads a `tg:` key back into its domain and entries (`None` if it is not well formed).
    fn decode(key: &str) -> Option<(Read, Vec<(Read, Read)>)> {
        let tag = key.strip_prefix("tg:{")?.strip_suffix('}')?;
        let mut fields: Vec<&str> = tag.split('|').collect();
        fields.pop()?; // the limit id
        let (domain, entries) = fields.split_first()?;
        let entries = entries
            .iter()
            .map(|f| {
                let (k, v) = f.split_once('=')?;
                Some((unescape(k)?, unescape(v)?))
            })
            .collect::<Option<Vec<_>>>()?;
        Some((unescape(domain)?, entries))
    }

    fn unescape(s: &str) -> Option<Read> {
        if let Some(hash) = s.strip_prefix("%#") {
            return Some(Read::Hashed(hash.to_string()));
        }
        let mut out = Vec::with_capacity(s.len());
        let mut rest = s.as_bytes();
        while let Some((&b, tail)) = rest.split_first() {
            if b == b'%' {
                let hex = std::str::from_utf8(tail.get(..2)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                rest = &tail[2..];
            } else {
                out.push(b);
                rest = tail;
            }
        }
        String::from_utf8(out).ok().map(Read::Verbatim)
    }

    fn key_of(domain: &str, entries: &[(String, String)]) -> String {
        bucket_key(
            "tg:",
            domain,
            entries.iter().map(|(k, v)| (k.as_str(), v.as_str())),
            &rate(Algorithm::TokenBucket),
            0,
            None,
        )
    }

    /// The key as `write!` spells it: the digits are written by hand on the hot path, and a
    /// key is a bucket's identity in Redis, so the hand-written spelling must be exactly this.
    fn key_as_written(
        domain: &str,
        entries: &[(String, String)],
        rate: &Rate,
        index: usize,
        shard: Option<u32>,
    ) -> String {
        let mut key = descriptor_part(
            "tg:",
            domain,
            entries.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        );
        let (tag, window) = (rate.algorithm.key_tag(), rate.window_ms());
        if index == OVERRIDE_INDEX {
            let _ = write!(key, "|{tag}:{window}:ov");
        } else {
            let _ = write!(key, "|{tag}:{window}:{index}");
        }
        if let Some(i) = shard {
            let _ = write!(key, "|#{i}");
        }
        key.push('}');
        key
    }

    #[test]
    fn digits_are_written_as_format_writes_them() {
        for n in [
            0,
            1,
            9,
            10,
            99,
            100,
            1_000_000_007,
            u64::from(u32::MAX),
            u64::MAX,
        ] {
            let mut out = String::from("x");
            push_u64(&mut out, n);
            assert_eq!(out, format!("x{n}"));
        }
    }

    proptest! {
        #![proptest_config(crate::testing::proptest_config(2_000))]

        #[test]
        fn property_keys_are_spelled_as_write_spells_them(
            (domain, entries) in (part(), entries()),
            rpu in prop_oneof![Just(1u32), any::<u32>()],
            burst in prop_oneof![Just(None), any::<u64>().prop_map(Some)],
            multiplier in 1u32..100_000,
            algorithm in prop::sample::select(vec![
                Algorithm::TokenBucket,
                Algorithm::FixedWindow,
                Algorithm::SlidingWindow,
                Algorithm::SlidingLog,
            ]),
            index in prop_oneof![Just(0usize), 1usize..20, Just(OVERRIDE_INDEX)],
            shard in prop_oneof![Just(None), any::<u32>().prop_map(Some)],
        ) {
            let rate = Rate {
                requests_per_unit: rpu,
                unit: Unit::Hour,
                unit_multiplier: multiplier,
                burst: burst.unwrap_or(u64::from(rpu)),
                algorithm,
                calendar: None,
            };
            let key = bucket_key(
                "tg:",
                &domain,
                entries.iter().map(|(k, v)| (k.as_str(), v.as_str())),
                &rate,
                index,
                shard,
            );
            prop_assert_eq!(key, key_as_written(&domain, &entries, &rate, index, shard));
        }

        /// Two different descriptors: independent ones, and (what random pairs seldom hit)
        /// one spelled with the text of an escape where the other has the character.
        #[test]
        fn property_distinct_descriptors_never_share_a_key(
            (d1, e1) in (part(), entries()),
            (d2, e2) in (part(), entries()),
            at in any::<usize>(),
        ) {
            if (&d1, &e1) != (&d2, &e2) {
                prop_assert_ne!(key_of(&d1, &e1), key_of(&d2, &e2));
            }
            let spelled = spelled_as_escape(&e1, at);
            if spelled != e1 {
                prop_assert_ne!(key_of(&d1, &e1), key_of(&d1, &spelled));
            }
        }

        /// Why no two descriptors share a key: the key reads back as exactly its descriptor
        /// (a hashed part as the SHA-1 of the original).
        #[test]
        fn property_a_key_reads_back_as_its_descriptor((d, e) in (part(), entries())) {
            let k = key_of(&d, &e);
            let Some((domain, entries)) = decode(&k) else {
                return Err(TestCaseError::fail(format!("unreadable: {k}")));
            };
            prop_assert!(domain.is(&d), "{:?} from {}", domain, k);
            prop_assert_eq!(entries.len(), e.len());
            for ((dk, dv), (ok, ov)) in entries.iter().zip(&e) {
                prop_assert!(dk.is(ok) && dv.is(ov), "{:?}={:?} from {}", dk, dv, k);
            }
        }

        /// The near misses random pairs seldom hit: the same text cut at another separator.
        #[test]
        fn property_moving_a_separator_changes_the_key(a in part(), b in part(), c in part()) {
            let k_eq = format!("{a}={b}");
            let v_eq = format!("{b}={c}");
            prop_assert_ne!(
                key_of("d", &[(k_eq, c.clone())]),
                key_of("d", &[(a.clone(), v_eq)])
            );
            let v_bar = format!("{b}|{a}={c}");
            prop_assert_ne!(
                key_of("d", &[(a.clone(), v_bar)]),
                key_of("d", &[(a.clone(), b.clone()), (a.clone(), c.clone())])
            );
            let d_bar = format!("{a}|{b}={c}");
            prop_assert_ne!(key_of(&d_bar, &[]), key_of(&a, &[(b, c)]));
        }

        #[test]
        fn property_all_shards_and_limits_of_a_bucket_keep_one_tag_each(
            domain in part(),
            entries in entries(),
            algorithm in prop::sample::select(&[
                Algorithm::TokenBucket,
                Algorithm::FixedWindow,
                Algorithm::SlidingWindow,
            ][..]),
        ) {
            let r = rate(algorithm);
            let mut all: HashSet<String> = HashSet::new();
            for index in [0, 1, 2, 7, OVERRIDE_INDEX] {
                let mut slots = HashSet::new();
                for shard in [None, Some(0), Some(1), Some(2), Some(9), Some(u32::MAX)] {
                    let k = bucket_key(
                        "tg:",
                        &domain,
                        entries.iter().map(|(k, v)| (k.as_str(), v.as_str())),
                        &r,
                        index,
                        shard,
                    );
                    // Exactly one tag, opening right after the prefix and closing at the end.
                    prop_assert_eq!(k.matches('{').count(), 1, "{}", k);
                    prop_assert_eq!(k.matches('}').count(), 1, "{}", k);
                    prop_assert_eq!(k.find('{'), Some("tg:".len()), "{}", k);
                    prop_assert!(k.ends_with('}'), "{}", k);
                    let tag = &k["tg:{".len()..k.len() - 1];
                    // The shard is inside the tag, last, so each shard gets its own slot.
                    // (`|#` appears nowhere else: escaping turns `#` into `%23`, and a hashed
                    // part starts `%#`.)
                    if let Some(i) = shard {
                        let suffix = format!("|#{i}");
                        prop_assert!(tag.ends_with(&suffix), "{}", k);
                        prop_assert_eq!(tag.matches("|#").count(), 1, "{}", k);
                    } else {
                        prop_assert!(!tag.contains("|#"), "{}", k);
                    }
                    // The slot is the tag's.
                    prop_assert_eq!(Slot::for_key(&k), Slot::for_key(tag));
                    slots.insert(Slot::for_key(&k));
                    prop_assert!(all.insert(k.clone()), "two shards or limits share {}", k);
                }
                // Six tags over 16,384 slots: all in one slot would be a broken tag.
                prop_assert!(slots.len() > 1);
            }
        }
    }
}
