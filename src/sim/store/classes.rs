//! The report's per-class store calls: which limit class each bucket belongs to, and how
//! many scripts each class's buckets ran in each virtual second.
//!
//! Flow: the driver names each bucket with its class as the bucket first appears
//! ([`ClassCalls::name`]) → a node counts every op it runs against its bucket's class
//! (`SimStore::run`) → the report reads the counts ([`ClassCalls::per_second`]).

use std::collections::HashMap;
use std::sync::Mutex;

use super::lock;

/// Which limit class each bucket belongs to (the driver names each bucket as it first
/// appears), and the scripts each class's buckets ran per virtual second: the report's
/// per-class store calls. Heartbeats and probes belong to no class.
#[derive(Debug, Default)]
pub struct ClassCalls {
    /// Bucket key (a sharded limit's without its shard part, `keys::bucket_id`) → class.
    of: Mutex<HashMap<String, usize>>,
    /// `[class][second]`.
    calls: Mutex<Vec<Vec<u64>>>,
    seconds: usize,
}

impl ClassCalls {
    pub fn new(duration_s: u64) -> Self {
        ClassCalls {
            seconds: duration_s as usize + 2,
            ..ClassCalls::default()
        }
    }

    /// `bucket` is a bucket of class `class`.
    pub fn name(&self, bucket: &str, class: usize) {
        lock(&self.of).insert(bucket.to_string(), class);
        let mut calls = lock(&self.calls);
        while calls.len() <= class {
            calls.push(vec![0; self.seconds]);
        }
    }

    pub(super) fn count(&self, key: &str, second: usize) {
        let Some(&class) = lock(&self.of).get(crate::keys::bucket_id(key)) else {
            return;
        };
        if let Some(n) = lock(&self.calls)
            .get_mut(class)
            .and_then(|c| c.get_mut(second))
        {
            *n += 1;
        }
    }

    /// `[class][second]`.
    pub fn per_second(&self) -> Vec<Vec<u64>> {
        lock(&self.calls).clone()
    }
}
