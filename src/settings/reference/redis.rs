//! The reference's Redis variables as tollgate's store settings: `BACKEND_TYPE`,
//! `REDIS_SOCKET_TYPE`, `REDIS_TYPE`, `REDIS_TLS` and `REDIS_URL` together make one store URL,
//! `REDIS_AUTH` its credentials, and the TLS variables its certificates.
//!
//! Data flows one way: the [`Reader`]'s variables → [`store`], which checks the backend and
//! the socket type, picks the address (the nutcracker socket when unset), reads the startup
//! give-up time from the table, builds the URL ([`store_url`]), then the credentials and the
//! TLS files → `(setting, value)` pairs. The reference's defaults are Redis over a unix socket
//! (a nutcracker proxy); a combination a unix socket cannot serve (a cluster, Sentinel, TLS)
//! is refused with what to set instead, as is skipping the certificate's host name check
//! without the name to expect.

use super::Refused;
use super::read::{Reader, refuse};
use super::table::{Group, apply};

/// Maps the store's variables, in a fixed order (the first refusal is the one reported).
pub(super) fn store(r: &mut Reader) -> Result<(), Refused> {
    refuse_other_backends(r)?;
    let (socket, unix) = socket_type(r)?;
    let url = address(r, unix)?;
    apply(r, Group::StoreStartup)?;
    let tls = r.flag("REDIS_TLS")?.unwrap_or(false);
    let store = store_url(r, &socket, unix, tls, url)?;
    r.set_from(
        &["REDIS_URL", "REDIS_TYPE", "REDIS_SOCKET_TYPE", "REDIS_TLS"],
        "store",
        store,
    );
    auth(r);
    apply(r, Group::Store)?;
    if tls {
        apply(r, Group::StoreTls)?;
        skip_hostname_verification(r)?;
    }
    Ok(())
}

fn refuse_other_backends(r: &mut Reader) -> Result<(), Refused> {
    let backend = r.var("BACKEND_TYPE").unwrap_or_else(|| "redis".to_string());
    if !backend.eq_ignore_ascii_case("redis") {
        return Err(refuse(
            "BACKEND_TYPE",
            &backend,
            "tollgate's shared store is Redis (or Valkey): BACKEND_TYPE=redis",
        ));
    }
    Ok(())
}

/// `REDIS_SOCKET_TYPE` as given (its default `unix`), and whether it is a unix socket.
fn socket_type(r: &mut Reader) -> Result<(String, bool), Refused> {
    let socket = r
        .var("REDIS_SOCKET_TYPE")
        .unwrap_or_else(|| "unix".to_string());
    let unix = match socket.to_ascii_lowercase().as_str() {
        "tcp" => false,
        "unix" => true,
        _ => {
            return Err(refuse(
                "REDIS_SOCKET_TYPE",
                &socket,
                "not a socket type: tcp or unix",
            ));
        }
    };
    Ok((socket, unix))
}

/// `REDIS_URL`: unset, the reference dials its nutcracker sidecar's socket; over TCP it has
/// no address to guess.
fn address(r: &mut Reader, unix: bool) -> Result<String, Refused> {
    match r.var("REDIS_URL") {
        Some(url) => Ok(url),
        None if unix => Ok("/var/run/nutcracker/ratelimit.sock".to_string()),
        None => Err(refuse(
            "REDIS_URL",
            "",
            "unset: the Redis address, host:port (or a comma list of cluster nodes)",
        )),
    }
}

/// The store URL: `REDIS_TYPE` is the scheme (`rediss` with `REDIS_TLS`), a unix socket is
/// one Redis without TLS at an absolute path, and Sentinel's `master,host:port…` becomes
/// `…://host:port…/master`.
fn store_url(
    r: &mut Reader,
    socket: &str,
    unix: bool,
    tls: bool,
    url: String,
) -> Result<String, Refused> {
    let redis_type = r.var("REDIS_TYPE").unwrap_or_else(|| "SINGLE".to_string());
    let scheme = match redis_type.to_ascii_lowercase().as_str() {
        "single" => "redis",
        "cluster" => "redis+cluster",
        "sentinel" => "redis+sentinel",
        _ => {
            return Err(refuse(
                "REDIS_TYPE",
                &redis_type,
                "not a Redis type: SINGLE, CLUSTER or SENTINEL",
            ));
        }
    };
    if unix && (scheme != "redis" || tls) {
        return Err(refuse(
            "REDIS_SOCKET_TYPE",
            socket,
            "a unix socket reaches one Redis without TLS: with REDIS_TYPE=CLUSTER, SENTINEL or REDIS_TLS=true set REDIS_SOCKET_TYPE=tcp",
        ));
    }
    if let Some((given, _)) = url.split_once("://") {
        return Err(refuse(
            "REDIS_URL",
            &url,
            &format!(
                "the reference's REDIS_URL is host:port (or a unix socket's path), with no {given}:// in front: REDIS_TYPE and REDIS_TLS choose the scheme"
            ),
        ));
    }
    if unix && !url.starts_with('/') {
        return Err(refuse(
            "REDIS_URL",
            &url,
            "not a unix socket's absolute path, which REDIS_SOCKET_TYPE=unix asks for (unix is the reference's default when REDIS_SOCKET_TYPE is unset): for host:port set REDIS_SOCKET_TYPE=tcp",
        ));
    }
    let scheme = if tls {
        scheme.replacen("redis", "rediss", 1)
    } else {
        scheme.to_string()
    };
    if unix {
        Ok(format!("redis+unix://{url}"))
    } else if scheme.ends_with("sentinel") {
        // The reference's form is `master,sentinel1:port,sentinel2:port`.
        let (master, sentinels) = url.split_once(',').ok_or_else(|| {
            refuse(
                "REDIS_URL",
                &url,
                "a Sentinel URL is master,host:port[,host:port…]",
            )
        })?;
        Ok(format!("{scheme}://{sentinels}/{master}"))
    } else {
        Ok(format!("{scheme}://{url}"))
    }
}

/// `REDIS_AUTH`: `password`, or `user:password` for an ACL user.
fn auth(r: &mut Reader) {
    if let Some(auth) = r.var("REDIS_AUTH") {
        match auth.split_once(':') {
            Some((user, password)) => {
                r.set_from(&["REDIS_AUTH"], "store_username", user.to_string());
                r.set_from(&["REDIS_AUTH"], "store_password", password.to_string());
            }
            None => r.set_from(&["REDIS_AUTH"], "store_password", auth),
        }
    }
}

/// `REDIS_TLS_SKIP_HOSTNAME_VERIFICATION=true`: skipping the check would accept any
/// certificate the CA ever signed; naming the host the certificate carries is the safe form
/// of the same fix, so it is accepted only beside that name (and named in the warning).
fn skip_hostname_verification(r: &mut Reader) -> Result<(), Refused> {
    if !r
        .flag("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION")?
        .unwrap_or(false)
    {
        return Ok(());
    }
    match r.peek("TOLLGATE_STORE_TLS_SERVER_NAME") {
        Some(name) => {
            r.ignore(format!(
                "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION (the certificate is checked against TOLLGATE_STORE_TLS_SERVER_NAME={name} instead)"
            ));
            Ok(())
        }
        None => Err(refuse(
            "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
            "true",
            "tollgate does not skip the check: set TOLLGATE_STORE_TLS_SERVER_NAME to the host name the Redis certificate carries",
        )),
    }
}
