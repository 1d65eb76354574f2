//! What kind of Redis server a `redis://` URL reaches, asked once at connect: the backend keeps
//! its locks on one primary, and a replica, a Sentinel or a Cluster node would each fail later
//! and less clearly (a replica refuses every write with `-READONLY`; a Sentinel knows none of
//! the scripts; a Cluster node answers `-MOVED` or `-CROSSSLOT` for a lock's keys).

use std::time::Duration;

use super::super::error::server_error;
use super::servers::Servers;
use super::Conn;
use crate::types::error::{Error, Result};

/// The server's role, read from the reply to `INFO` (the default sections: `server`,
/// `replication` and `cluster` among them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Role {
    /// A primary of a standalone server: what the backend needs.
    Primary,
    /// A replica of `primary` (`host:port`, as it reports it).
    Replica { primary: String },
    /// A Sentinel (`redis_mode:sentinel`).
    Sentinel,
    /// A node of a Redis Cluster (`redis_mode:cluster`, or `cluster_enabled:1`).
    Cluster,
}

impl Role {
    /// Reads the role from an `INFO` reply. A reply without the fields (a server or proxy that
    /// leaves them out) is taken as a primary: writes then tell.
    pub(crate) fn of_info(info: &str) -> Role {
        let field = |name: &str| {
            info.lines().find_map(|l| {
                l.trim_end_matches('\r')
                    .strip_prefix(name)?
                    .strip_prefix(':')
                    .map(str::to_string)
            })
        };
        match field("redis_mode").as_deref() {
            Some("sentinel") => return Role::Sentinel,
            Some("cluster") => return Role::Cluster,
            _ => {}
        }
        if field("cluster_enabled").as_deref() == Some("1") {
            return Role::Cluster;
        }
        if field("role").as_deref() == Some("slave") {
            let host = field("master_host").unwrap_or_default();
            let port = field("master_port").unwrap_or_default();
            return Role::Replica {
                primary: format!("{host}:{port}"),
            };
        }
        Role::Primary
    }

    /// `Ok` for a primary; otherwise the error that says what the URL reaches and what to give
    /// instead.
    pub(crate) fn required_primary(self) -> Result<()> {
        match self {
            Role::Primary => Ok(()),
            Role::Replica { primary } => Err(Error::Config(format!(
                "the Redis URL reaches a replica (of {primary}), which refuses writes: give the \
                 primary's address (a replica promoted later would not have every lease)"
            ))),
            Role::Sentinel => Err(Error::Config(
                "the Redis URL reaches a Sentinel, not a data server: to follow the primary it \
                 watches across failovers, give redis+sentinel://<this host:port>/<master \
                 name> (SENTINEL MASTERS lists the names)"
                    .to_string(),
            )),
            Role::Cluster => Err(Error::Config(
                "the Redis URL reaches a Redis Cluster node: give redis+cluster://<this \
                 host:port>[,<another node>...], so that each lock goes to the node of its slot"
                    .to_string(),
            )),
        }
    }
}

/// Checks at connect that the server answers and is a standalone primary: a Cluster's nodes
/// were asked for its slots already, and a server that refuses `INFO` is taken as one.
///
/// # Errors
/// [`Error::Config`] for a server that is no primary (a replica, a Sentinel, a Cluster node),
/// [`Error::Server`] when the server does not answer `INFO` in time.
pub(crate) async fn require_primary(
    conn: &Conn,
    servers: &Servers,
    timeout: Duration,
) -> Result<()> {
    // A Cluster's nodes were asked for its slots already; other servers must be a
    // primary.
    let info = match servers {
        Servers::Cluster(_) => Ok(String::new()),
        _ => {
            conn.run("", Some(timeout), |mut c| async move {
                redis::cmd("INFO").query_async::<String>(&mut c).await
            })
            .await
        }
    };
    match info {
        Ok(info) => Role::of_info(&info).required_primary()?,
        // A server that refuses INFO (renamed, disabled or denied by its operator) is taken
        // as a primary: its first write tells otherwise.
        Err(e)
            if matches!(
                e.kind(),
                redis::ErrorKind::Server(
                    redis::ServerErrorKind::ResponseError | redis::ServerErrorKind::NoPerm
                )
            ) => {}
        Err(e) => return Err(server_error("connect", e)),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_are_read_from_info() {
        let primary = "# Server\r\nredis_version:7.0.15\r\nredis_mode:standalone\r\n# Replication\r\nrole:master\r\nconnected_slaves:2\r\n# Cluster\r\ncluster_enabled:0\r\n";
        assert_eq!(Role::of_info(primary), Role::Primary);
        let replica =
            "redis_mode:standalone\r\nrole:slave\r\nmaster_host:127.0.0.1\r\nmaster_port:6380\r\n";
        assert_eq!(
            Role::of_info(replica),
            Role::Replica {
                primary: "127.0.0.1:6380".into()
            }
        );
        assert_eq!(Role::of_info("redis_mode:sentinel\r\n"), Role::Sentinel);
        assert_eq!(
            Role::of_info("redis_mode:cluster\r\nrole:master\r\n"),
            Role::Cluster
        );
        assert_eq!(
            Role::of_info("role:master\r\ncluster_enabled:1\r\n"),
            Role::Cluster
        );
        // A proxy that shows nothing: taken as a primary.
        assert_eq!(Role::of_info(""), Role::Primary);
        // A field's name is matched whole: `role_x` is not `role`.
        assert_eq!(Role::of_info("role_x:slave\r\n"), Role::Primary);
    }

    #[test]
    fn every_refusal_says_what_to_give_instead() {
        assert!(Role::Primary.required_primary().is_ok());
        for role in [
            Role::Replica {
                primary: "10.0.0.1:6379".into(),
            },
            Role::Sentinel,
            Role::Cluster,
        ] {
            let err = role.required_primary().unwrap_err().to_string();
            assert!(err.contains("give"), "{err}");
        }
    }
}
