//! Connecting to an etcd cluster: the connect string's endpoints and user, the gRPC client's
//! options (TLS, credentials, HTTP/2 pings), and the first contact that checks a member answers
//! and is new enough.

use etcd_client::{Client, ConnectOptions};

use super::error;
use super::session::{attempt_bound, Keepers};
use super::EtcdConfig;
use crate::types::error::{Error, Result};

/// The oldest etcd the backend works with (revision bounds on range reads, lease keep-alive
/// streams and watches from a revision: all in 3.4's v3 API).
const OLDEST: (u32, u32) = (3, 4);

/// A user name and its password.
pub(super) type User = (String, String);

/// The endpoints of an `etcd://` connect string, and the user it names.
pub(super) fn parse_url(url: &str) -> Result<(Vec<String>, Option<User>)> {
    let bad = |why: &str| error::bad_connect_string(url, why);
    let trimmed = url.trim();
    let (rest, scheme) = match trimmed.strip_prefix("etcds://") {
        Some(rest) => (rest, "https"),
        None => (
            trimmed
                .strip_prefix("etcd://")
                .ok_or_else(|| bad("it does not start with etcd:// or etcds://"))?,
            "http",
        ),
    };
    let (user, hosts) = match rest.rsplit_once('@') {
        Some((user, hosts)) => {
            let (name, password) = user.split_once(':').unwrap_or((user, ""));
            (Some((name.to_string(), password.to_string())), hosts)
        }
        None => (None, rest),
    };
    let hosts = hosts.strip_suffix('/').unwrap_or(hosts);
    if hosts.contains('/') || hosts.contains('?') {
        return Err(bad("it has a path or options, which etcd does not take"));
    }
    let mut endpoints = Vec::new();
    for host in hosts.split(',').map(str::trim) {
        if host.is_empty() {
            return Err(bad("a host is empty"));
        }
        let with_port = match host.rsplit_once(':') {
            Some((h, port)) if !h.is_empty() && !h.ends_with(':') => {
                port.parse::<u16>()
                    .map_err(|_| bad(&format!("the port of {host} is not a number")))?;
                host.to_string()
            }
            _ => format!("{host}:2379"),
        };
        endpoints.push(format!("{scheme}://{with_port}"));
    }
    Ok((endpoints, user))
}

/// `3.4.23` -> whether it is at least [`OLDEST`].
fn new_enough(version: &str) -> bool {
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let major = parts.next().unwrap_or(0);
    let minor = parts.next().unwrap_or(0);
    (major, minor) >= OLDEST
}

/// How the backend's clients connect: a member cut off from the others answers nothing but
/// errors (`require_leader`: no request, watch or keep-alive waits on a member without a
/// leader), and a silent connection (a frozen member) is found by HTTP/2 pings within a third
/// of the lease and given up after [`attempt_bound`], so that requests move to the members that
/// answer.
fn connect_options(
    config: &EtcdConfig,
    user: Option<&User>,
    tls: Option<&etcd_client::TlsOptions>,
) -> ConnectOptions {
    let ttl = config.options.lease;
    let options = ConnectOptions::new()
        .with_connect_timeout(config.connect_timeout)
        .with_require_leader(true)
        .with_keep_alive(ttl / 3, attempt_bound(ttl))
        .with_keep_alive_while_idle(true);
    let options = match tls {
        Some(tls) => options.with_tls(tls.clone()),
        None => options,
    };
    match user {
        Some((name, password)) => options.with_user(name.clone(), password.clone()),
        None => options,
    }
}

/// The gRPC client's TLS settings from [`Tls`](crate::types::tls::Tls) (its files read now), for
/// `endpoints` (`https://`); `None` in plaintext.
fn grpc_tls(config: &EtcdConfig, endpoints: &[String]) -> Result<Option<etcd_client::TlsOptions>> {
    if !endpoints.iter().any(|e| e.starts_with("https://")) {
        return Ok(None);
    }
    let tls = config.options.tls.clone().unwrap_or_default();
    let first = endpoints[0].trim_start_matches("https://");
    let pem = tls.pem_now(first)?;
    let mut options = etcd_client::TlsOptions::new();
    options = match pem.ca {
        Some(ca) => options.ca_certificate(etcd_client::Certificate::from_pem(ca)),
        None => options.with_native_roots(),
    };
    if let Some((cert, key)) = pem.client {
        options = options.identity(etcd_client::Identity::from_pem(cert, key));
    }
    if let Some(name) = pem.server_name {
        options = options.domain_name(name);
    }
    Ok(Some(options))
}

/// Connects to the cluster at `endpoints` as `user` and checks that a member answers and that
/// it is new enough.
pub(super) async fn open(
    config: &EtcdConfig,
    endpoints: &[String],
    user: Option<&User>,
) -> Result<Client> {
    let tls = grpc_tls(config, endpoints)?;
    let options = connect_options(config, user, tls.as_ref());
    let timeout = config.connect_timeout;
    let tls_config = config.options.tls.clone().unwrap_or_default();
    // A failed step of connecting: credentials refused, a TLS failure, or no member answered.
    let failed = |e: etcd_client::Error| -> Error {
        error::connect_failed(
            e,
            &config.url,
            user.map_or("", |u| u.0.as_str()),
            tls.as_ref()
                .map(|_| (endpoints[0].trim_start_matches("https://"), &tls_config)),
        )
    };
    let timed_out = |_| error::connect_timed_out(&config.url);
    let mut client = tokio::time::timeout(timeout, Client::connect(endpoints, Some(options)))
        .await
        .map_err(timed_out)?
        .map_err(&failed)?;
    let status = tokio::time::timeout(timeout, client.status())
        .await
        .map_err(timed_out)?
        .map_err(&failed)?;
    if !new_enough(status.version()) {
        return Err(error::too_old(status.version(), OLDEST));
    }
    Ok(client)
}

/// The clients the session's keep-alives go through: with several members, one member at a
/// time, the next one after a keep-alive failed or stayed silent (see [`Keepers`]); with one,
/// the manager's `client`.
pub(super) fn keepers(
    config: &EtcdConfig,
    endpoints: &[String],
    user: Option<&User>,
    client: &Client,
) -> Result<Keepers> {
    Ok(if endpoints.len() > 1 {
        let tls = grpc_tls(config, endpoints)?;
        Keepers::each(
            endpoints.to_vec(),
            connect_options(config, user, tls.as_ref()),
        )
    } else {
        Keepers::one(client.clone())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_strings() {
        let (eps, user) = parse_url("etcd://a:2379,b:2380,c").unwrap();
        assert_eq!(eps, ["http://a:2379", "http://b:2380", "http://c:2379"]);
        assert!(user.is_none());
        let (eps, user) = parse_url("etcd://me:pw@127.0.0.1:1/").unwrap();
        assert_eq!(eps, ["http://127.0.0.1:1"]);
        assert_eq!(user, Some(("me".into(), "pw".into())));
        let err = parse_url("etcd://me:secret@h:x").unwrap_err().to_string();
        assert!(!err.contains("secret") && err.contains("port"), "{err}");
        assert!(parse_url("etcd://h:1/prefix").is_err());
        assert!(parse_url("etcd://").is_err());
    }

    #[test]
    fn versions() {
        assert!(new_enough("3.4.23") && new_enough("3.5.0") && new_enough("4.0.0"));
        assert!(!new_enough("3.3.27") && !new_enough("2.3.8") && !new_enough("junk"));
    }
}
