//! The bounds one replica's RLQS streams live within, and their fairness: streams in all
//! (`rlqs_max_streams`) and per peer (`rlqs_max_streams_per_peer`, by remote IP address, so one
//! client cannot take every place), and the bytes of bucket-id state they hold
//! (`rlqs_max_state_bytes`, each id counted as [`tracked_bytes`]).
//!
//! A [`Session`](super::Session) takes a stream place when it opens ([`Caps::open`]) and gives
//! it back when dropped ([`Caps::close`]); each bucket id it comes to hold reserves its bytes
//! first ([`Caps::reserve`]) and releases them when the id goes ([`Caps::release`]). What does
//! not fit is refused and counted by the caller: a stream with RESOURCE_EXHAUSTED, an id with
//! `DENY_ALL`.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::RlqsError;

/// What one tracked bucket id counts against `rlqs_max_state_bytes`: its text once (the
/// session's key), each part up to [`keys::MAX_PART`](crate::keys::MAX_PART) bytes twice more
/// (the store key, in its `Quota` and as the shared demand's key; longer parts are hashed
/// there), and [`TRACKED_OVERHEAD`]. `tests/rlqs_memory.rs` counts the bytes an id really keeps
/// live (with the memory store's bucket) and holds this to at least that.
pub fn tracked_bytes(id: &[(String, String)]) -> u64 {
    let text: usize = id.iter().map(|(k, v)| k.len() + v.len()).sum();
    let in_key: usize = id
        .iter()
        .map(|(k, v)| k.len().min(crate::keys::MAX_PART) + v.len().min(crate::keys::MAX_PART))
        .sum();
    (text + 2 * in_key + TRACKED_OVERHEAD) as u64
}

/// The fixed bytes of one tracked id: its `Tracked`, the entries of the session's, the demand's
/// and the store's maps (at their emptiest just after they grow), and its bucket's state
/// (measured: about 1,000 bytes).
pub const TRACKED_OVERHEAD: usize = 1_280;

/// The places taken, by all streams of this replica.
#[derive(Debug, Default)]
pub(super) struct Caps {
    streams: AtomicUsize,
    /// Streams by peer address; a peer with none has no entry.
    peers: Mutex<HashMap<IpAddr, usize>>,
    /// Bytes of bucket-id state held ([`tracked_bytes`] per id).
    state_bytes: AtomicU64,
}

impl Caps {
    /// Takes a stream place for `peer` (when its address is known), within `max` in all and
    /// `per_peer` for that address. The refusal says which bound, for its status and metric.
    pub(super) fn open(
        &self,
        peer: Option<IpAddr>,
        max: usize,
        per_peer: usize,
    ) -> Result<(), RlqsError> {
        if let Some(ip) = peer {
            let mut peers = self.peers();
            let n = peers.entry(ip).or_insert(0);
            if *n >= per_peer {
                if *n == 0 {
                    peers.remove(&ip);
                }
                return Err(RlqsError::TooManyStreamsFromPeer {
                    peer: ip,
                    max: per_peer,
                });
            }
            *n += 1;
        }
        let taken = self
            .streams
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            });
        if taken.is_err() {
            self.release_peer(peer);
            return Err(RlqsError::TooManyStreams(max));
        }
        Ok(())
    }

    /// Gives back a place [`Caps::open`] took, with the bytes its ids still held.
    pub(super) fn close(&self, peer: Option<IpAddr>, bytes: u64) {
        self.release(bytes);
        self.release_peer(peer);
        self.streams.fetch_sub(1, Ordering::AcqRel);
    }

    /// Reserves `bytes` of state if they fit within `max` (atomically: streams admit ids at
    /// once, and a check followed by an add would let each of them past the bound).
    pub(super) fn reserve(&self, bytes: u64, max: u64) -> bool {
        self.state_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(bytes).filter(|&n| n <= max)
            })
            .is_ok()
    }

    pub(super) fn release(&self, bytes: u64) {
        self.state_bytes.fetch_sub(bytes, Ordering::AcqRel);
    }

    /// Bytes of state held now.
    #[cfg(test)]
    pub(super) fn state_bytes(&self) -> u64 {
        self.state_bytes.load(Ordering::Acquire)
    }

    /// Peers holding at least one stream.
    #[cfg(test)]
    pub(super) fn peers_holding(&self) -> usize {
        self.peers().len()
    }

    fn release_peer(&self, peer: Option<IpAddr>) {
        let Some(ip) = peer else { return };
        let mut peers = self.peers();
        if let Some(n) = peers.get_mut(&ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                peers.remove(&ip);
            }
        }
    }

    fn peers(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, usize>> {
        self.peers.lock().unwrap_or_else(|p| p.into_inner())
    }
}
