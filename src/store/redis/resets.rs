//! Resetting buckets on Redis (the admin port's counter API): the buckets' keys deleted, and
//! the reset written to the fleet's log (`lua/resets.lua`) that every replica reads (each
//! membership interval) to forget its over-limit cache entries and leases of those buckets.
//!
//! Each key is deleted on its own (`DEL`, routed by the cluster connection to its slot's
//! primary): a request's buckets may hash to several slots, and one multi-key `DEL` across
//! slots is refused on a cluster. Bounded by the connect timeout, like the membership
//! heartbeat: an operator's call, not a decision.

use std::time::Duration;

use super::RedisStore;
use super::errors::CallError;
use crate::store::{ResetLog, StoreError, StoreErrorKind};

/// `lua/resets.lua`, compiled into the binary.
pub const RESETS_LUA: &str = include_str!("../../../lua/resets.lua");

/// The log's two keys from the membership set's key (`<prefix>{members}`): same hash tag.
fn log_keys(members_key: &str) -> [String; 2] {
    [
        format!("{members_key}:reset-seq"),
        format!("{members_key}:resets"),
    ]
}

impl RedisStore {
    /// Deletes `keys` and appends them to the reset log under `members_key`; how many of the
    /// keys existed.
    pub async fn reset(&self, keys: &[String], members_key: &str) -> Result<u64, StoreError> {
        let mut conn = self.any_conn()?;
        let timeout = self.pool.connect_timeout();
        let mut deleted = 0;
        for key in keys {
            let mut del = redis::cmd("DEL");
            del.arg(key);
            deleted += bounded(timeout, del.query_async::<u64>(&mut conn), "DEL").await?;
        }
        let [seq, log] = log_keys(members_key);
        let mut append = self.resets.key(seq);
        append.key(log).arg("append");
        for key in keys {
            append.arg(key);
        }
        bounded(
            timeout,
            append.invoke_async::<u64>(&mut conn),
            "the reset log",
        )
        .await?;
        Ok(deleted)
    }

    /// The reset log after sequence number `after` (`None`: only where it is now).
    pub async fn resets_since(
        &self,
        members_key: &str,
        after: Option<u64>,
    ) -> Result<ResetLog, StoreError> {
        let mut conn = self.any_conn()?;
        let [seq, log] = log_keys(members_key);
        let mut read = self.resets.key(seq);
        let after_arg = after.map_or(-1, |n| i64::try_from(n).unwrap_or(i64::MAX));
        read.key(log).arg("read").arg(after_arg);
        let reply: Vec<redis::Value> = bounded(
            self.pool.connect_timeout(),
            read.invoke_async(&mut conn),
            "the reset log",
        )
        .await?;
        let mut items = reply.into_iter();
        let int = |v: Option<redis::Value>| match v {
            Some(redis::Value::Int(n)) => Ok(n.max(0) as u64),
            other => Err(StoreError::new(
                StoreErrorKind::Protocol,
                format!("resets.lua answered {other:?}"),
            )),
        };
        let seq = int(items.next())?;
        if after.is_none() {
            return Ok(ResetLog {
                seq,
                keys: Vec::new(),
                complete: true,
            });
        }
        let complete = int(items.next())? == 1;
        let keys = items
            .filter_map(|v| match v {
                redis::Value::BulkString(b) => String::from_utf8(b).ok(),
                _ => None,
            })
            .collect();
        Ok(ResetLog {
            seq,
            keys,
            complete,
        })
    }

    pub(super) fn any_conn(&self) -> Result<super::connect::Conn, StoreError> {
        match self.pool.pick() {
            Some(picked) => Ok((*picked.conn).clone()),
            None => Err(StoreError::new(
                StoreErrorKind::Connection,
                "not connected to Redis",
            )),
        }
    }
}

/// `call`, given up after `timeout`.
pub(super) async fn bounded<T>(
    timeout: Duration,
    call: impl std::future::Future<Output = redis::RedisResult<T>>,
    what: &str,
) -> Result<T, StoreError> {
    match tokio::time::timeout(timeout, call).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(CallError::Redis(e).into_store_error()),
        Err(_) => Err(StoreError::new(
            StoreErrorKind::Timeout,
            format!("{what} timed out"),
        )),
    }
}
