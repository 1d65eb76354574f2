//! Curator's node protocol on ZooKeeper: node names and their order, CONTAINER lock paths,
//! ACLs, and the background deletes that clean up after a release or a cancelled acquire.

use super::error::zk_error;
use std::sync::Arc;

use once_cell::sync::Lazy;
use zookeeper_client::{Acls, Client, CreateMode, CreateOptions};

use std::time::Duration;

use super::session::{connection_lost, is_terminal, wait_reconnect};
use super::Inner;
use crate::backend::LockTarget;
use crate::metrics;
use crate::types::backend_kind::BackendKind;
use crate::types::error::{Error, Result};
use crate::types::layout::run_record;

/// How often a create is tried again when the lock path vanishes under it (reaped by the server
/// as an empty container between our making it and our create): each time it is made again.
pub(crate) const PATH_VANISHED_RETRIES: usize = 20;

pub(crate) static EPHEMERAL_SEQUENTIAL: CreateOptions<'static> =
    CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
/// Contender nodes of a manager with credentials: only the same credentials may touch them.
pub(crate) static EPHEMERAL_SEQUENTIAL_PROTECTED: CreateOptions<'static> =
    CreateMode::EphemeralSequential.with_acls(Acls::creator_all());
/// Jobs' run records: they must outlive the process that ran the job.
static PERSISTENT: CreateOptions<'static> = CreateMode::Persistent.with_acls(Acls::anyone_all());
static PERSISTENT_PROTECTED: CreateOptions<'static> =
    CreateMode::Persistent.with_acls(Acls::creator_all());
static CONTAINER: CreateOptions<'static> = CreateMode::Container.with_acls(Acls::anyone_all());
static CONTAINER_PROTECTED: CreateOptions<'static> =
    CreateMode::Container.with_acls(Acls::creator_all());

/// The create options of contender nodes for `inner`'s manager.
pub(crate) fn contender_options(inner: &Inner) -> &'static CreateOptions<'static> {
    if inner.config.protected {
        &EPHEMERAL_SEQUENTIAL_PROTECTED
    } else {
        &EPHEMERAL_SEQUENTIAL
    }
}

/// The data each contender node carries: who created it (Curator writes the client's address).
/// `zklock host=<host> pid=<pid>[ id=<identity>]`; see [`Owner`](crate::Owner).
pub(crate) fn node_data(identity: Option<&str>) -> Vec<u8> {
    static HOST: Lazy<String> = Lazy::new(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .or_else(|_| std::env::var("HOSTNAME"))
            .unwrap_or_else(|_| "unknown".into())
    });
    let mut data = format!("zklock host={} pid={}", *HOST, std::process::id());
    if let Some(id) = identity {
        data.push_str(" id=");
        data.push_str(id);
    }
    data.into_bytes()
}

/// The text Curator sorts contenders by: what follows the last occurrence of the lock name
/// (`StandardLockInternalsDriver.fixForSorting`). Compared as strings, as Curator does.
pub(crate) fn sort_key<'a>(node: &'a str, lock_name: &str) -> &'a str {
    match node.rfind(lock_name) {
        Some(i) => &node[i + lock_name.len()..],
        None => node,
    }
}

/// Creates `dir` and its missing ancestors as CONTAINER nodes, which the server removes once
/// they are empty, so that no lock path is left behind.
///
/// With credentials, the lock path itself is `creator_all` (deleting a child needs DELETE on
/// its parent, so this is what keeps other tenants from removing contenders); the ancestors
/// stay open so that every tenant can make its own lock paths.
pub(crate) async fn ensure_parents(inner: &Inner, client: &Client, dir: &str) -> Result<()> {
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

/// The digest scheme's id of `user:password`, as ZooKeeper computes it for a session that
/// authenticated with it: `user:base64(sha1(user:password))`.
pub(crate) fn digest_id(credentials: &str) -> String {
    use base64::Engine;
    let user = credentials.split_once(':').map_or(credentials, |(u, _)| u);
    let hash = sha1_smol::Sha1::from(credentials).digest().bytes();
    format!(
        "{user}:{}",
        base64::engine::general_purpose::STANDARD.encode(hash)
    )
}

/// With credentials, checks that the lock path `dir` (its incarnation `czxid`, as the listing
/// that will decide the grant saw it) gives DELETE and ADMIN to no one but this manager's
/// credentials: whoever may delete a child may delete a holder's node, and whoever may set the
/// ACL may give himself that right. A path created by this manager is `creator_all` and
/// passes; one made by a client without credentials (`world:anyone`), or under other
/// credentials, is refused ([`Error::UnprotectedPath`]). One request per incarnation of the
/// path: what was checked is remembered by its czxid, and a path re-created since (reaped when
/// empty, then made again by anyone) is checked again.
pub(crate) async fn check_path_acl(
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

/// Deletes a contender node: the request is sent now, so that any later request of this
/// session is ordered after it; the reply is awaited in the background, retrying on
/// connection loss until the node is gone or the session (and so the node) has ended.
pub(crate) fn delete_in_background(inner: &Arc<Inner>, client: Client, path: String) {
    inner.count_requests(1);
    let first = client.delete(&path, None);
    let counter = inner.clone();
    inner.spawn_background(async move {
        let mut result = first.await;
        loop {
            match result {
                Ok(()) | Err(zookeeper_client::Error::NoNode) => return,
                Err(err) if connection_lost(&err) => {
                    if !wait_reconnect(&client).await {
                        return;
                    }
                    counter.count_requests(1);
                    metrics::release_retry(BackendKind::ZooKeeper);
                    result = client.delete(&path, None).await;
                }
                Err(err) if is_terminal(&err) => return,
                Err(err) => {
                    tracing::warn!(%path, %err, "could not delete lock node");
                    return;
                }
            }
        }
    });
}

/// Removes the node a create may have made when its reply never came: the `_c_<uuid>-`
/// prefix finds it (Curator's protected mode). The listing is sent now, so it is ordered
/// after the create.
pub(crate) fn delete_by_prefix_in_background(
    inner: &Arc<Inner>,
    client: Client,
    dir: Arc<str>,
    prefix: String,
) {
    inner.count_requests(1);
    let listing = client.get_children(&dir);
    let owner = inner.clone();
    inner.spawn_background(async move {
        let mut result = listing.await.map(|(children, _)| children);
        loop {
            match result {
                Ok(children) => {
                    for child in children.into_iter().filter(|c| c.starts_with(&prefix)) {
                        delete_in_background(&owner, client.clone(), format!("{dir}/{child}"));
                    }
                    return;
                }
                Err(err) if connection_lost(&err) => {
                    if !wait_reconnect(&client).await {
                        return;
                    }
                    owner.count_requests(1);
                    result = client.list_children(&dir).await;
                }
                Err(_) => return,
            }
        }
    });
}

/// The data of a run record: no run may start before this server time (ms since the epoch).
fn not_before(data: &[u8]) -> Option<i64> {
    std::str::from_utf8(data)
        .ok()?
        .strip_prefix("not-before=")?
        .parse()
        .ok()
}

/// [`Backend::claim_run`](crate::backend::Backend::claim_run) on ZooKeeper, by the server's
/// clock: a write to the run record returns the server's time of that write (its mtime), which
/// is compared with the `not-before` an earlier run left there.
///
/// No write ever weakens a recorded window: the write that learns the server's time puts back
/// the very data it read (a conditional write on the version read), so a claim cancelled,
/// killed or cut off after any of its requests leaves the record as strong as it found it;
/// only a claim that runs writes a new `not-before`, later than both the old one and now.
/// Two requests and one write when the job is skipped, three and two when it runs.
pub(crate) async fn claim_run(
    inner: &Arc<Inner>,
    target: &LockTarget,
    at_least: Duration,
) -> Result<bool> {
    let session = inner.live_session(None).await?;
    let client = &session.client;
    let record = run_record(&target.path);
    let fail = |op, err| zk_error(op, &record, err);
    let persistent = if inner.config.protected {
        &PERSISTENT_PROTECTED
    } else {
        &PERSISTENT
    };
    loop {
        inner.count_requests(1);
        let (data, version) = match client.get_data(&record).await {
            Ok((data, stat)) => (data, Some(stat.version)),
            Err(zookeeper_client::Error::NoNode) => (Vec::new(), None),
            Err(err) => return Err(fail("read the job's last run", err)),
        };
        // A write whose stat tells the server's time now, and that changes nothing: the same
        // data, or a new record with none.
        inner.count_requests(1);
        let stamped = match version {
            Some(version) => client.set_data(&record, &data, Some(version)).await,
            None => match client.create(&record, &data, persistent).await {
                Ok((stat, _)) => Ok(stat),
                Err(zookeeper_client::Error::NodeExists) => continue,
                Err(zookeeper_client::Error::NoNode) => {
                    ensure_parents(inner, client, &target.path).await?;
                    continue;
                }
                Err(err) => Err(err),
            },
        };
        let stat = match stamped {
            Ok(stat) => stat,
            // Someone else (not under the job's lock) wrote meanwhile: look again.
            Err(zookeeper_client::Error::BadVersion) => continue,
            Err(err) => return Err(fail("record the job's run", err)),
        };
        let now = stat.mtime;
        if not_before(&data).is_some_and(|before| before > now) {
            return Ok(false);
        }
        let window = format!("not-before={}", now + at_least.as_millis() as i64);
        inner.count_requests(1);
        match client
            .set_data(&record, window.as_bytes(), Some(stat.version))
            .await
        {
            Ok(_) => return Ok(true),
            Err(zookeeper_client::Error::BadVersion) => continue,
            Err(err) => return Err(fail("record the job's run", err)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::queue;
    use super::*;

    #[test]
    fn sorts_like_curator() {
        assert_eq!(
            sort_key("_c_8d0f-lock-0000000007", queue::MUTEX_NAME),
            "0000000007"
        );
        assert_eq!(sort_key("lock-0000000003", queue::MUTEX_NAME), "0000000003");
        // The last occurrence counts, so a uuid or prefix containing "lock-" does not confuse it.
        assert_eq!(
            sort_key("_c_x-lock-lock-0000000001", queue::MUTEX_NAME),
            "0000000001"
        );
        assert_eq!(sort_key("foreign", queue::MUTEX_NAME), "foreign");
    }
}
