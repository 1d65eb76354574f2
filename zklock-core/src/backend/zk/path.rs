//! The lock path on ZooKeeper: made on first use as CONTAINER nodes (reaped by the server once
//! empty), and, with credentials, its ACL checked before any grant on it.

use std::sync::Arc;

use zookeeper_client::Client;

use super::error::zk_error;
use super::wire::{CONTAINER, CONTAINER_PROTECTED};
use super::Inner;
use crate::types::error::{Error, Result};

/// How often a create is tried again when the lock path vanishes under it (reaped by the server
/// as an empty container between our making it and our create): each time it is made again.
pub(super) const PATH_VANISHED_RETRIES: usize = 20;

/// Creates `dir` and its missing ancestors as CONTAINER nodes, which the server removes once
/// they are empty, so that no lock path is left behind.
///
/// With credentials, the lock path itself is `creator_all` (deleting a child needs DELETE on
/// its parent, so this is what keeps other tenants from removing contenders); the ancestors
/// stay open so that every tenant can make its own lock paths.
pub(super) async fn ensure_parents(inner: &Inner, client: &Client, dir: &str) -> Result<()> {
    let leaf = if inner.config.protected {
        &CONTAINER_PROTECTED
    } else {
        &CONTAINER
    };
    for _ in 0..PATH_VANISHED_RETRIES {
        match client.create(dir, &[], leaf).await {
            Ok(_) | Err(zookeeper_client::Error::NodeExists) => return Ok(()),
            Err(zookeeper_client::Error::NoNode) => {
                let parent = &dir[..dir.rfind('/').unwrap_or(0)];
                if !parent.is_empty() {
                    match client.mkdir(parent, &CONTAINER).await {
                        Ok(()) => {}
                        // mkdir makes every ancestor: only a missing chroot stops it for good.
                        Err(zookeeper_client::Error::NoNode)
                            if matches!(client.check_stat("/").await, Ok(None)) =>
                        {
                            return Err(Error::Config(format!(
                                "cannot create the lock path {dir}: the chroot of the connect \
                                 string does not exist on the server; create it first or remove \
                                 it from the connect string"
                            )))
                        }
                        Err(zookeeper_client::Error::NoNode) => {}
                        Err(err) => return Err(zk_error("create the lock path", parent, err)),
                    }
                }
            }
            Err(err) => return Err(zk_error("create the lock path", dir, err)),
        }
    }
    Err(zk_error(
        "create the lock path",
        dir,
        zookeeper_client::Error::NoNode,
    ))
}

/// With credentials, checks that the lock path `dir` (its incarnation `czxid`, as the listing
/// that will decide the grant saw it) gives DELETE and ADMIN to no one but this manager's
/// credentials: whoever may delete a child may delete a holder's node, and whoever may set the
/// ACL may give himself that right. A path created by this manager is `creator_all` and
/// passes; one made by a client without credentials (`world:anyone`), or under other
/// credentials, is refused ([`Error::UnprotectedPath`]). One request per incarnation of the
/// path: what was checked is remembered by its czxid, and a path re-created since (reaped when
/// empty, then made again by anyone) is checked again.
pub(super) async fn check_path_acl(
    inner: &Inner,
    client: &Client,
    dir: &Arc<str>,
    czxid: i64,
) -> Result<()> {
    let Some(owner) = inner.config.owner.as_deref() else {
        return Ok(());
    };
    if inner.safe_paths.lock().unwrap().get(dir) == Some(&czxid) {
        return Ok(());
    }
    inner.count_requests(1);
    let (acls, stat) = client
        .get_acl(dir)
        .await
        .map_err(|err| zk_error("read the lock path's ACL", dir, err))?;
    let dangerous = zookeeper_client::Permission::DELETE | zookeeper_client::Permission::ADMIN;
    let foreign = |acl: &zookeeper_client::Acl| {
        (acl.permission() & dangerous) != zookeeper_client::Permission::NONE
            && !(acl.scheme() == "digest" && acl.id() == owner)
    };
    if acls.iter().any(foreign) {
        let acl = acls
            .iter()
            .map(|a| format!("{}:{}:{}", a.scheme(), a.id(), a.permission()))
            .collect::<Vec<_>>()
            .join(", ");
        return Err(Error::UnprotectedPath {
            path: dir.to_string(),
            acl,
        });
    }
    let mut safe = inner.safe_paths.lock().unwrap();
    // A bound on what is remembered: past it, paths are simply checked again.
    if safe.len() >= SAFE_PATHS_REMEMBERED {
        safe.clear();
    }
    safe.insert(dir.clone(), stat.czxid);
    Ok(())
}

/// How many checked lock paths a manager with credentials remembers (see [`check_path_acl`]).
const SAFE_PATHS_REMEMBERED: usize = 4096;
