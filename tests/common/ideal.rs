//! What one exact token bucket of a limit does with the same requests: the yardstick an
//! accuracy test holds a fleet (replicas, regions) to, per window of the limit's length.
//!
//! Two measures per window, both from the requests' send times and answers:
//!
//! - **`ideal`**: what one bucket (starting full) admits when fed *every* request, in the
//!   order sent. The fleet should admit about this much: less is under-admission.
//! - **`over`**: the fleet's admissions fed, in the order sent, to one bucket (starting full)
//!   that is never charged for a request it has no token for: each such admission is one
//!   the limit did not allow whatever had happened before. A fleet that keeps the limit
//!   exactly has none; each one is over-admission, never offset by admitting less elsewhere.
//!
//! [`check`] fails a window whose admissions pass `ideal + allowed` or whose `over` passes
//! `allowed`, printing every window.

/// One request as a test saw it.
#[derive(Clone, Copy, Debug)]
pub struct Sent {
    /// When it was sent, ms from the test's start.
    pub at_ms: u64,
    /// Whether it was admitted.
    pub admitted: bool,
}

/// A token bucket's numbers.
#[derive(Clone, Copy, Debug)]
pub struct Limit {
    /// The burst.
    pub capacity: f64,
    /// Tokens per window.
    pub refill: f64,
    pub window_ms: u64,
}

/// One window's counts.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Window {
    pub asked: u64,
    pub admitted: u64,
    pub ideal: u64,
    pub over: u64,
}

/// A bucket that takes one token per request when it has one.
pub struct Bucket {
    limit: Limit,
    tokens: f64,
    at_ms: u64,
}

impl Bucket {
    pub fn new(limit: Limit) -> Bucket {
        Bucket {
            limit,
            tokens: limit.capacity,
            at_ms: 0,
        }
    }

    /// Takes a token at `at_ms` if there is one.
    pub fn take(&mut self, at_ms: u64) -> bool {
        let l = self.limit;
        let elapsed = at_ms.saturating_sub(self.at_ms) as f64;
        self.tokens = (self.tokens + elapsed * l.refill / l.window_ms as f64).min(l.capacity);
        self.at_ms = self.at_ms.max(at_ms);
        // A hair of slack: a fleet's own clock rounds too.
        if self.tokens >= 1.0 - 1e-9 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// The counts of each of the first `windows` windows of `limit.window_ms`.
pub fn windows(sent: &[Sent], limit: Limit, windows: usize) -> Vec<Window> {
    let mut sent = sent.to_vec();
    sent.sort_by_key(|s| s.at_ms);
    let mut out = vec![Window::default(); windows];
    let (mut all, mut admitted) = (Bucket::new(limit), Bucket::new(limit));
    for s in &sent {
        let Some(w) = out.get_mut((s.at_ms / limit.window_ms) as usize) else {
            continue;
        };
        w.asked += 1;
        if all.take(s.at_ms) {
            w.ideal += 1;
        }
        if s.admitted {
            w.admitted += 1;
            if !admitted.take(s.at_ms) {
                w.over += 1;
            }
        }
    }
    out
}

/// A table of `windows`, one line each.
pub fn table(windows: &[Window]) -> String {
    let mut t = String::from("window: asked admitted ideal over\n");
    for (i, w) in windows.iter().enumerate() {
        t.push_str(&format!(
            "{i:>6}: {:>5} {:>8} {:>5} {:>4}\n",
            w.asked, w.admitted, w.ideal, w.over
        ));
    }
    t
}

/// Fails the first window `i` whose admissions pass `ideal + allowed(i)` or whose `over`
/// passes `allowed(i)`; `what` names the run in the message, which prints every window.
pub fn check(what: &str, windows: &[Window], allowed: impl Fn(usize) -> u64) {
    let t = table(windows);
    eprintln!("{what}, against one exact bucket:\n{t}");
    for (i, w) in windows.iter().enumerate() {
        assert!(
            w.admitted <= w.ideal + allowed(i) && w.over <= allowed(i),
            "{what}: window {i} admitted {} (one exact bucket: {}, over it: {}; allowed {}):\n{t}",
            w.admitted,
            w.ideal,
            w.over,
            allowed(i)
        );
    }
}
