//! Semaphore leases on ZooKeeper: Curator's `InterProcessSemaphoreV2` layout. A mutex on
//! `<path>/locks` admits one acquirer at a time; it creates its leases
//! `<path>/leases/_c_<uuid>-lease-<seq>` and waits, still holding the mutex, until at most N
//! leases exist. Only that one acquirer watches the leases: no herd.

use std::sync::Arc;

use zookeeper_client::EventType;

use super::contender::acquire_node;
use super::hold::{HandedWatch, Hold};
use super::node::create_node;
use super::session::connection_lost;
use super::Inner;
use crate::backend::{BackendHold, LockTarget, SharedHold};
use crate::types::error::{Error, Result};
use crate::types::loss::LossReason;
use crate::types::mode::HoldMode;
use crate::types::mode::Wait;

/// Takes the `<path>/locks` gate, makes all `n` lease nodes on the gate's own session, and
/// waits, still holding the gate, until at most `max_leases` leases exist: all or none.
/// Holding the gate through all `n` is what keeps two acquirers of several leases from each
/// taking some and waiting for the others for ever; and a lease counted under the gate must
/// come from the session that holds the gate. `Ok(None)` only for [`Wait::Never`].
///
/// Cancel safe: the gate and the leases made so far go when the future is dropped.
pub(crate) async fn acquire_leases(
    inner: &Arc<Inner>,
    target: &LockTarget,
    max_leases: u32,
    n: u32,
    wait: Wait,
) -> Result<Option<Vec<SharedHold>>> {
    let key = &target.key;
    let gate_path: Arc<str> = format!("{}/locks", target.path).into();
    let leases: Arc<str> = format!("{}/leases", target.path).into();
    let Some(gate) = acquire_node(inner, &gate_path, key, HoldMode::Exclusive, None, wait).await?
    else {
        return Ok(None);
    };
    let session = gate.session.clone();
    let gate_lost = || {
        gate.loss_reason().map(|reason| Error::LockLost {
            key: key.to_string(),
            reason,
        })
    };
    let mut holds = Vec::with_capacity(n as usize);
    let mut children = Vec::new();
    for _ in 0..n {
        if let Some(err) = gate_lost() {
            return Err(err);
        }
        let made = create_node(
            inner,
            &session,
            &leases,
            key,
            HoldMode::Lease,
            wait.deadline(),
        )
        .await?;
        holds.push(Hold::new(
            inner.clone(),
            session.clone(),
            key.clone(),
            made.node,
            made.token,
            made.ticket,
            HandedWatch::NoWatch,
        ));
        children = made.children;
    }
    let names: Vec<String> = holds
        .iter()
        .map(|h| h.node.rsplit('/').next().unwrap_or_default().to_string())
        .collect();
    let client = session.client.clone();
    loop {
        if let Some(err) = gate_lost() {
            return Err(err);
        }
        if let Some(name) = names.iter().find(|n| !children.contains(n)) {
            tracing::warn!(%key, %name, "semaphore lease node deleted while waiting");
            return Err(Error::LockLost {
                key: key.to_string(),
                reason: LossReason::NodeDeleted,
            });
        }
        if children.len() <= max_leases as usize {
            break;
        }
        if matches!(wait, Wait::Never) {
            return Ok(None);
        }
        inner.count_requests(1);
        let (kids, watcher) = match client.list_and_watch_children(&leases).await {
            Ok(listed) => listed,
            Err(err) if connection_lost(&err) => {
                session
                    .wait_connected("list the leases", wait.deadline())
                    .await?;
                continue;
            }
            Err(err) => return Err(Error::zk("list the leases", &leases, err)),
        };
        children = kids;
        if children.len() <= max_leases as usize {
            continue;
        }
        let event = match wait {
            Wait::Until(deadline, waited) => {
                match tokio::time::timeout_at(deadline, watcher.changed()).await {
                    Ok(event) => event,
                    Err(_) => {
                        return Err(Error::Timeout {
                            key: key.to_string(),
                            waited,
                        })
                    }
                }
            }
            _ => watcher.changed().await,
        };
        if event.event_type == EventType::Session {
            return Err(Error::SessionExpired);
        }
        inner.count_requests(1);
        children = match client.list_children(&leases).await {
            Ok(kids) => kids,
            Err(err) if connection_lost(&err) => {
                session
                    .wait_connected("list the leases", wait.deadline())
                    .await?;
                continue;
            }
            Err(err) => return Err(Error::zk("list the leases", &leases, err)),
        };
    }
    // HandedWatch up before returning, not in the background: an acquirer that comes right after
    // this one returned (a `try_acquire` above all) must find the gate free. Cancel safe: a
    // drop here deletes the gate in the background, and the leases with it (the acquire did
    // not complete). A failure means the gate's session ended: so did the leases, and their
    // holds report it.
    if let Err(err) = gate.release().await {
        tracing::debug!(%key, %err, "semaphore gate release failed");
    }
    Ok(Some(
        holds
            .into_iter()
            .map(|hold| {
                tracing::debug!(%key, node = %hold.node, "semaphore lease acquired");
                Arc::new(hold) as Arc<dyn BackendHold>
            })
            .collect(),
    ))
}
