//! Free loopback ports that no other test, in this process or another, will hand out at the same time.
//!
//! A port is picked at random *below* the kernel's ephemeral range (so no outgoing client connection can
//! take it while its server is stopped for a restart), checked to be bindable, and then claimed with a lock
//! file `<tmp>/zklock-testkit-ports/<port>.lock` holding our pid. The claim lasts as long as the
//! [`PortLease`]; a lock file left behind by a dead process is taken over.

use std::collections::hash_map::RandomState;
use std::collections::HashSet;
use std::fs::{self, OpenOptions};
use std::hash::{BuildHasher, Hash, Hasher};
use std::io::{self, Write};
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::process::is_alive;

/// Ports claimed by this process (the lock files guard against other processes).
static CLAIMED: Mutex<Option<HashSet<u16>>> = Mutex::new(None);

/// A port claimed for one server's whole life; released on drop.
#[derive(Debug)]
pub(crate) struct PortLease {
    port: u16,
    lock_file: PathBuf,
}

impl PortLease {
    pub(crate) fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for PortLease {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.lock_file);
        let mut claimed = CLAIMED.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(set) = claimed.as_mut() {
            set.remove(&self.port);
        }
    }
}

/// Claims `n` distinct free ports.
pub(crate) fn reserve(n: usize) -> io::Result<Vec<PortLease>> {
    let dir = lock_dir();
    fs::create_dir_all(&dir)?;
    let (low, high) = candidate_range();
    let mut leases = Vec::with_capacity(n);
    let mut attempts = 0;
    while leases.len() < n {
        attempts += 1;
        if attempts > 1000 + 100 * n {
            return Err(io::Error::new(
                io::ErrorKind::AddrNotAvailable,
                format!("could not find {n} free loopback ports in {low}..{high}"),
            ));
        }
        let port = match (low, high) {
            (0, 0) => ephemeral_port()?,
            _ => low + (random() % u64::from(high - low)) as u16,
        };
        if let Some(lease) = try_claim(&dir, port)? {
            leases.push(lease);
        }
    }
    Ok(leases)
}

/// The range to pick from: below the kernel's ephemeral range, or `(0, 0)` to let the kernel choose.
fn candidate_range() -> (u16, u16) {
    let ephemeral_low = fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    if ephemeral_low >= 12_000 {
        (10_000, ephemeral_low)
    } else {
        (0, 0)
    }
}

fn ephemeral_port() -> io::Result<u16> {
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
        .local_addr()?
        .port())
}

fn try_claim(dir: &Path, port: u16) -> io::Result<Option<PortLease>> {
    {
        let mut claimed = CLAIMED.lock().unwrap_or_else(|e| e.into_inner());
        let set = claimed.get_or_insert_with(HashSet::new);
        if !set.insert(port) {
            return Ok(None);
        }
    }
    let unclaim = || {
        let mut claimed = CLAIMED.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(set) = claimed.as_mut() {
            set.remove(&port);
        }
    };
    let lock_file = dir.join(format!("{port}.lock"));
    let created = match create_lock(&lock_file) {
        Ok(true) => true,
        Ok(false) if is_stale(&lock_file) => {
            let _ = fs::remove_file(&lock_file);
            create_lock(&lock_file).unwrap_or(false)
        }
        Ok(false) => false,
        Err(e) => {
            unclaim();
            return Err(e);
        }
    };
    if !created {
        unclaim();
        return Ok(None);
    }
    let lease = PortLease { port, lock_file };
    // Claimed, but someone outside our scheme may be using it.
    if TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_err() {
        return Ok(None); // dropping the lease releases the claim
    }
    Ok(Some(lease))
}

/// Creates the lock file with our pid in it; `Ok(false)` if it exists already.
fn create_lock(path: &Path) -> io::Result<bool> {
    match OpenOptions::new().write(true).create_new(true).open(path) {
        Ok(mut f) => {
            write!(f, "{}", std::process::id())?;
            Ok(true)
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(e),
    }
}

/// A lock file is stale when the process named in it is gone (or it stayed empty for a while). Only for
/// ports not in [`CLAIMED`]: a lock naming this process is stale unless it is claimed.
fn is_stale(path: &Path) -> bool {
    match fs::read_to_string(path)
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
    {
        Some(pid) => pid == std::process::id() || !is_alive(pid),
        None => age(path).is_some_and(|age| age > Duration::from_secs(10)),
    }
}

fn age(path: &Path) -> Option<Duration> {
    fs::metadata(path).ok()?.modified().ok()?.elapsed().ok()
}

/// Removes lock files older than `min_age` whose process is gone.
pub(crate) fn sweep(min_age: Duration) {
    let Ok(entries) = fs::read_dir(lock_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let dead_owner = fs::read_to_string(&path)
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
            .is_some_and(|pid| !is_alive(pid));
        if dead_owner && age(&path).is_some_and(|age| age > min_age) {
            let _ = fs::remove_file(&path);
        }
    }
}

fn lock_dir() -> PathBuf {
    std::env::temp_dir().join("zklock-testkit-ports")
}

fn random() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = RandomState::new().build_hasher();
    std::process::id().hash(&mut h);
    COUNTER.fetch_add(1, Ordering::Relaxed).hash(&mut h);
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
        .hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_are_distinct_and_released() {
        let leases = reserve(6).unwrap();
        let ports: HashSet<u16> = leases.iter().map(PortLease::port).collect();
        assert_eq!(ports.len(), 6);
        let files: Vec<PathBuf> = leases.iter().map(|l| l.lock_file.clone()).collect();
        assert!(files.iter().all(|f| f.exists()));
        drop(leases);
        assert!(files.iter().all(|f| !f.exists()));
    }

    #[test]
    fn stale_lock_of_dead_process_is_taken_over() {
        let dir = tempfile::tempdir().unwrap();
        let port = reserve(1).unwrap().remove(0).port();
        let lock = dir.path().join(format!("{port}.lock"));
        fs::write(&lock, "4000000000").unwrap(); // not a live pid
        let lease = try_claim(dir.path(), port)
            .unwrap()
            .expect("stale lock taken over");
        assert_eq!(
            fs::read_to_string(&lock).unwrap(),
            std::process::id().to_string()
        );
        drop(lease);
    }
}
