//! `zklock-bench-suite`: every workload for zklock and its peers, side by side, backend by
//! backend, printed as markdown with zklock's ratio to each peer and each row's target ("met"
//! or "missed" from the ratios of the same run):
//!
//! - ZooKeeper: zklock beside the floor (bare create + delete), zookeeper-client's recipe,
//!   Curator, kazoo and the naive herd ([`zookeeper`]);
//! - Redis: zklock's Redis backend beside rslock and a bare `SET NX PX` floor ([`redis`]);
//! - Redis under Sentinel: zklock through the Sentinels beside zklock and rslock on the
//!   primary's address, on a primary with 2 replicas and 3 Sentinels ([`sentinel`]);
//! - Redis Cluster: zklock on `redis+cluster://` beside rslock routed by slot to a manager per
//!   primary, on 3 primaries with a replica each ([`cluster`]);
//! - PostgreSQL: zklock's PostgreSQL backend beside a bare `pg_advisory_lock` floor on a
//!   durable server ([`postgres`]);
//! - MySQL / MariaDB: zklock's MySQL backend beside a bare `GET_LOCK` + `RELEASE_LOCK` floor
//!   on a durable MariaDB ([`mysql`]);
//! - etcd: zklock's etcd backend beside a bare put-on-a-lease + delete floor and etcd's own
//!   lock service (`Lock` / `Unlock`), on a member that fsyncs its log ([`etcd`]);
//! - TLS: zklock with mutual TLS beside zklock in plaintext, on each of ZooKeeper, Redis,
//!   PostgreSQL and etcd: what encryption costs ([`tls`]).
//!
//! The Redis, PostgreSQL and MySQL sections end with zklock's memory with 10,000 tasks waiting
//! on one key and the server connections of its process ([`backend_memory`]).
//!
//! ```text
//! zklock-bench-suite [--connect HOSTS] [--quick] [--no-fsync] [--out FILE] [--rounds N]
//!                    [--only zookeeper|redis|sentinel|cluster|postgres|mysql|etcd|tls]
//!                    [--charts DIR] [--rtt DURATION] [--loopback-charts DIR]
//! ```
//!
//! With `--charts DIR` it also draws each section's tables as SVG charts into `DIR`
//! ([`charts`]), linked under each section of the markdown, each chart's data beside it as
//! JSON. A run at a distance given `--loopback-charts DIR` (the loopback run's `--charts`)
//! also draws each chart with the loopback run's figures beside its own.
//!
//! With `--rtt 1ms` (any duration) every section but TLS runs at that network distance: a
//! relay of the test kit in front of each server delays every byte, and the relays count the
//! round trips per cycle ([`distance`]).
//!
//! Every section runs its cells in rounds, the peers taking turns, and shows each cell's
//! median run ([`rounds`]). Every run is a child process ([`runner`]): `zklock-bench` (next to
//! this binary) for zklock and the peers written in Rust, the test kit's `peers/run` for
//! Curator and kazoo, `java CuratorMem` (this crate's `java/`) for Curator's memory. Servers
//! are the test kit's: real ones on free loopback ports, stopped at exit.

mod backend_memory;
mod charts;
mod cli;
mod cluster;
mod cpu_target;
mod distance;
mod etcd;
mod model;
mod mysql;
mod postgres;
mod redis;
mod report;
mod rounds;
mod runner;
mod sentinel;
mod tls;
mod verdict;
mod zookeeper;
mod zookeeper_tables;

use std::process::ExitCode;

use clap::Parser;

use cli::{Cli, Section};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let outcome = if cli.serve {
        zookeeper::serve(!cli.no_fsync).map(|()| None)
    } else {
        suite(&cli).map(Some)
    };
    let sections = match outcome {
        Ok(Some(sections)) => sections,
        Ok(None) => return ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("zklock-bench-suite: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut code = ExitCode::SUCCESS;
    // The charts, drawn once every section's markdown is made; linked only if written.
    let written = match &cli.charts {
        Some(dir) => match charts::write_all(dir, cli.loopback_charts.as_deref()) {
            Ok(written) => {
                for w in &written {
                    eprintln!("chart: {}", dir.join(&w.file).display());
                }
                written
            }
            Err(e) => {
                eprintln!("zklock-bench-suite: {e}");
                code = ExitCode::FAILURE;
                vec![]
            }
        },
        None => vec![],
    };
    let mut markdown = String::new();
    for (section, title, md) in sections {
        // At a distance every section says so in its heading, the first one too.
        if !markdown.is_empty() || cli.rtt.is_some() {
            markdown.push_str(&format!("\n## {title}\n\n"));
        }
        if let Some(rtt) = cli.rtt.filter(|_| section.goes_far()) {
            markdown.push_str(&distance::note(rtt));
        }
        markdown.push_str(&md);
        if let Some(dir) = &cli.charts {
            markdown.push_str(&charts::links(&written, section.slug(), dir));
        }
    }
    print!("{markdown}");
    if let Some(path) = &cli.out {
        if let Err(e) = std::fs::write(path, &markdown) {
            eprintln!("zklock-bench-suite: cannot write {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    }
    code
}

/// A section's run: its markdown.
type SectionRun = fn(&Cli) -> Result<String, String>;

/// Every section `--only` lets run, one after the other: each one's markdown, after its
/// title.
fn suite(cli: &Cli) -> Result<Vec<(Section, String, String)>, String> {
    let sections: [(Section, &str, SectionRun); 8] = [
        (Section::Zookeeper, "ZooKeeper", zookeeper::section),
        (Section::Redis, "Redis", redis::section),
        (Section::Sentinel, "Redis under Sentinel", sentinel::section),
        (Section::Cluster, "Redis Cluster", cluster::section),
        (Section::Postgres, "PostgreSQL", postgres::section),
        (Section::Mysql, "MySQL", mysql::section),
        (Section::Etcd, "etcd", etcd::section),
        (Section::Tls, "TLS", tls::section),
    ];
    let mut done = vec![];
    for (section, title, run) in sections {
        if !cli.runs(section) {
            continue;
        }
        let rtt = cli.rtt.filter(|_| section.goes_far());
        charts::begin_section(section.slug(), title, rtt, cli.quick);
        let title = distance::title(title, cli.rtt, section.goes_far());
        done.push((section, title, run(cli)?));
    }
    Ok(done)
}
