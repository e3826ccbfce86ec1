//! What the regions sharing global limits tell each other through the global store
//! (`lua/regions.lua`; the sharing itself is `src/regions/`): a replica's heartbeat (and its
//! leaving), and a replica's demand for one global key with every region's total back. Each call is bounded by
//! the caller's `timeout` (an exchange must not hang past the next): background work, never a
//! decision.

use super::RedisStore;
use super::resets::bounded;
use crate::store::{StoreError, StoreErrorKind};

/// `lua/regions.lua`, compiled into the binary.
pub const REGIONS_LUA: &str = include_str!("../../../lua/regions.lua");

impl RedisStore {
    /// Says `replica` of `region` is alive for `ttl_ms` in the heartbeat hash `key` (an ended
    /// beat is remembered for `memory_ms`), with the `settings` its shares are computed from
    /// (kept in `<key>|settings`, the same slot); every replica heard from within that memory,
    /// as its `<region>|<replica>` field, the ms its beat has left (0 or less: ended) and the
    /// settings it published (empty when it published none).
    pub async fn region_beat(
        &self,
        key: &str,
        (region, replica): (&str, &str),
        ttl_ms: u64,
        memory_ms: u64,
        settings: &str,
        timeout: std::time::Duration,
    ) -> Result<Vec<(String, i64, String)>, StoreError> {
        let mut conn = self.any_conn()?;
        let mut call = self.regions.key(key);
        call.key(format!("{key}|settings"))
            .arg("beat")
            .arg(region)
            .arg(replica)
            .arg(ttl_ms)
            .arg(memory_ms)
            .arg(settings);
        let reply: Vec<redis::Value> = bounded(
            timeout,
            call.invoke_async(&mut conn),
            "the regions' heartbeat",
        )
        .await?;
        reply
            .chunks(3)
            .map(|triple| match triple {
                [
                    redis::Value::BulkString(field),
                    redis::Value::Int(left),
                    redis::Value::BulkString(settings),
                ] => Ok((
                    String::from_utf8_lossy(field).into_owned(),
                    *left,
                    String::from_utf8_lossy(settings).into_owned(),
                )),
                other => Err(StoreError::new(
                    StoreErrorKind::Protocol,
                    format!("regions.lua answered {other:?}"),
                )),
            })
            .collect()
    }

    /// Takes `replica`'s heartbeat and settings out of `key` (a graceful stop).
    pub async fn region_leave(
        &self,
        key: &str,
        (region, replica): (&str, &str),
        timeout: std::time::Duration,
    ) -> Result<(), StoreError> {
        let mut conn = self.any_conn()?;
        let mut call = self.regions.key(key);
        call.key(format!("{key}|settings"))
            .arg("leave")
            .arg(region)
            .arg(replica);
        bounded(
            timeout,
            call.invoke_async::<redis::Value>(&mut conn),
            "leaving the regions' heartbeat",
        )
        .await?;
        Ok(())
    }

    /// Records `replica` of `region` asking `demand_ppm` of the global key whose demand hash is
    /// `key`, for `ttl_ms`; every region's total demand for it.
    pub async fn region_demand(
        &self,
        key: &str,
        region: &str,
        replica: &str,
        demand_ppm: u64,
        ttl_ms: u64,
        timeout: std::time::Duration,
    ) -> Result<Vec<(String, u64)>, StoreError> {
        let mut conn = self.any_conn()?;
        let mut call = self.regions.key(key);
        call.arg("demand")
            .arg(region)
            .arg(replica)
            .arg(demand_ppm)
            .arg(ttl_ms);
        let reply: Vec<redis::Value> = bounded(
            timeout,
            call.invoke_async(&mut conn),
            "a global key's demand",
        )
        .await?;
        reply
            .chunks(2)
            .map(|pair| match pair {
                [redis::Value::BulkString(name), redis::Value::Int(n)] => Ok((
                    String::from_utf8_lossy(name).into_owned(),
                    (*n).max(0) as u64,
                )),
                other => Err(StoreError::new(
                    StoreErrorKind::Protocol,
                    format!("regions.lua answered {other:?}"),
                )),
            })
            .collect()
    }
}
