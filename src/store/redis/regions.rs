//! What the regions sharing global limits tell each other through the global store
//! (`lua/regions.lua`; the sharing itself is `src/regions/`): a region's heartbeat, and a
//! replica's demand for one global key with every region's total back. Each call is bounded by
//! the caller's `timeout` (an exchange must not hang past the next): background work, never a
//! decision.

use super::RedisStore;
use super::resets::bounded;
use crate::store::{StoreError, StoreErrorKind};

/// `lua/regions.lua`, compiled into the binary.
pub const REGIONS_LUA: &str = include_str!("../../../lua/regions.lua");

impl RedisStore {
    /// Says `region` is alive for `ttl_ms` in the heartbeat hash `key`; the regions alive now.
    pub async fn region_beat(
        &self,
        key: &str,
        region: &str,
        ttl_ms: u64,
        timeout: std::time::Duration,
    ) -> Result<Vec<String>, StoreError> {
        let mut conn = self.any_conn()?;
        let mut call = self.regions.key(key);
        call.arg("beat").arg(region).arg(ttl_ms);
        let reply: Vec<redis::Value> = bounded(
            timeout,
            call.invoke_async(&mut conn),
            "the regions' heartbeat",
        )
        .await?;
        Ok(reply
            .chunks(2)
            .filter_map(|pair| match pair.first() {
                Some(redis::Value::BulkString(b)) => String::from_utf8(b.clone()).ok(),
                _ => None,
            })
            .collect())
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
