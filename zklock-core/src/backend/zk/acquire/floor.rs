//! The granted floor: what this process's own exclusive grants on a lock path vouch for (every
//! node sorting below the highest one granted is gone for good), kept per lock path while a
//! contender of this process (waiting or holding) uses it, and stamped with the incarnation of
//! the path and the session it was learned on.

use std::sync::Arc;

use super::super::Inner;

#[derive(Default)]
pub(crate) struct DirState {
    /// Local contenders (waiting or holding) on this lock path.
    pub(super) contenders: usize,
    /// What this process learned from its exclusive grants on the path; see [`Floor`].
    pub(super) granted: Option<Floor>,
}

/// Which incarnation of a lock path, seen through which session, something was learned on: the
/// path's czxid (a path that empties is reaped by the server and may be re-created by anyone,
/// its sequence numbers starting again at 0) and the session's generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Incarnation {
    pub(super) generation: u64,
    pub(super) czxid: i64,
}

/// The sort key of the highest node this process was granted an exclusive hold on, in one
/// incarnation of the path: every node of that incarnation that sorts below it was gone at the
/// grant and never comes back. Worth nothing for another incarnation or session.
#[derive(Debug, Clone)]
pub(super) struct Floor {
    pub(super) incarnation: Incarnation,
    pub(super) sort_key: String,
}

/// Keeps a lock path's local state alive while a contender of this process uses it.
pub(crate) struct DirTicket {
    inner: Arc<Inner>,
    pub(super) dir: Arc<str>,
}

impl DirTicket {
    /// The granted floor learned on `incarnation` of the path, if any: a floor learned on
    /// another incarnation or session is forgotten here.
    pub(super) fn granted_floor(&self, incarnation: Incarnation) -> Option<String> {
        let mut dirs = self.inner.dirs.lock().unwrap();
        let state = dirs.get_mut(&self.dir)?;
        match &state.granted {
            Some(floor) if floor.incarnation == incarnation => Some(floor.sort_key.clone()),
            Some(_) => {
                state.granted = None;
                None
            }
            None => None,
        }
    }

    /// Records an exclusive grant of the node sorting as `sort_key` in `incarnation`.
    pub(super) fn record_grant(&self, incarnation: Incarnation, sort_key: &str) {
        let mut dirs = self.inner.dirs.lock().unwrap();
        if let Some(d) = dirs.get_mut(&self.dir) {
            let higher = match &d.granted {
                Some(floor) if floor.incarnation == incarnation => {
                    floor.sort_key.as_str() < sort_key
                }
                _ => true,
            };
            if higher {
                d.granted = Some(Floor {
                    incarnation,
                    sort_key: sort_key.to_string(),
                });
            }
        }
    }
}

impl Drop for DirTicket {
    fn drop(&mut self) {
        let mut dirs = self.inner.dirs.lock().unwrap();
        if let Some(d) = dirs.get_mut(&self.dir) {
            d.contenders -= 1;
            if d.contenders == 0 {
                dirs.remove(&self.dir);
            }
        }
    }
}

impl Inner {
    /// Registers a local contender on `dir`; the returned token unregisters it on drop.
    pub(super) fn enter_dir(self: &Arc<Self>, dir: &Arc<str>) -> DirTicket {
        let mut dirs = self.dirs.lock().unwrap();
        dirs.entry(dir.clone()).or_default().contenders += 1;
        DirTicket {
            inner: self.clone(),
            dir: dir.clone(),
        }
    }
}
