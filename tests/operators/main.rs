//! What operators see and set: inspection and revocation, metrics, tracing, ACLs, TLS, bad input.
//! The metrics and tracing tests capture through a recorder and a subscriber local to their thread,
//! which the other tests here do not reach.
//!
//! One test binary, `cargo test --test operators`: each file of `tests/operators/` is a module of
//! it, so its tests are named `<file>::<test>` (`cargo test --test operators -- acl_tenants::`).
//! The helpers of `tests/common/` are included once, here, and the files use them through
//! `crate::`.

#[path = "../common/cluster.rs"]
mod cluster;
#[path = "../common/mod.rs"]
mod common;
#[path = "../common/faults.rs"]
mod faults;

mod acl_tenants;
mod bad_input;
mod capture;
mod hostile_keys;
mod least_privilege;
mod metrics;
mod revoke_and_inspect;
mod secrets;
mod tls;
mod tls_mysql;
mod tls_redis_ha;
mod tls_servers;
mod tracing_events;
