//! Keys are untrusted input: nothing is ever created outside the namespace, bad keys are
//! refused with a clear error, and different keys never share a node.

use crate::common;

use std::collections::HashSet;

use common::*;
use zklock::Error;

#[tokio::test]
async fn hostile_keys_stay_inside_the_namespace() {
    let zk = server();
    let m = zklock::LockManager::builder(zk.connect_string())
        .namespace("/tenant/locks")
        .connect()
        .await
        .unwrap();
    let hostile = [
        "/",
        "//",
        ".",
        "..",
        "../..",
        "../../zookeeper",
        "/zookeeper/quota",
        "a/../../b",
        "%2F",
        "%2E%2E",
        "a%2Fb",
        "a/b",
        " ",
        "ünïcødé",
        "🔒",
        "_c_00000000-0000-0000-0000-000000000000-lock-0000000001",
        "lock-",
        "zookeeper",
        "\u{202e}rtl",
        "x".repeat(zklock::MAX_KEY_LEN).leak(),
    ];
    let mut dirs = HashSet::new();
    for key in hostile {
        let g = m.lock(key).await.unwrap_or_else(|e| panic!("{key:?}: {e}"));
        let dir = g.node_path().rsplit_once('/').unwrap().0.to_string();
        assert_eq!(
            dir.rsplit_once('/').unwrap().0,
            "/tenant/locks",
            "{key:?} escaped: {dir}"
        );
        assert!(
            dirs.insert(dir.clone()),
            "{key:?} shares {dir} with another key"
        );
        g.release().await.unwrap();
    }
    for bad in [
        "",
        "nul\0byte",
        "new\nline",
        "\u{7f}",
        &"y".repeat(zklock::MAX_KEY_LEN + 1),
    ] {
        match m.lock(bad).await {
            Err(Error::InvalidKey { reason, .. }) => assert!(!reason.is_empty()),
            other => panic!("{bad:?} was not refused: {other:?}"),
        }
    }
    let everything = tree(&m, "/").await;
    for p in &everything {
        assert!(
            p == "/tenant" || p.starts_with("/tenant/locks"),
            "created outside the namespace: {p}"
        );
    }
}

#[tokio::test]
async fn bad_namespace_and_raw_paths_are_refused() {
    let zk = server();
    for ns in ["relative", "/", "/a/", "/a/../b", "/zookeeper/x"] {
        let err = zklock::LockManager::builder(zk.connect_string())
            .namespace(ns)
            .connect()
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Config(_)), "{ns}: {err}");
    }
    let m = manager(&zk.connect_string()).await;
    for p in ["no-slash", "/x/", "/x//y", "/zookeeper"] {
        assert!(
            matches!(m.mutex_at_path(p), Err(Error::InvalidArgument(_))),
            "{p}"
        );
    }
}
