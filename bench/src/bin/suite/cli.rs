//! The suite's command line.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use crate::distance::Distance;

/// Runs every benchmark and prints the markdown tables.
#[derive(Parser, Debug)]
#[command(name = "zklock-bench-suite")]
pub(crate) struct Cli {
    /// Use this ZooKeeper instead of starting one.
    #[arg(long)]
    pub(crate) connect: Option<String>,
    /// Tiny sizes: checks that every peer runs, figures mean nothing (one round).
    #[arg(long)]
    pub(crate) quick: bool,
    /// Also run the slow probes no target needs: zklock's memory with 10,000 waiters and the
    /// local queue off (on ZooKeeper each waiter lists 10,000 siblings: about a minute; on
    /// Redis and PostgreSQL one run each, a few seconds; not on MySQL, where each waiter would
    /// need a session of its own).
    #[arg(long)]
    pub(crate) extended: bool,
    /// Also write the markdown to this file.
    #[arg(long)]
    pub(crate) out: Option<PathBuf>,
    /// Also draw each section's tables as SVG charts into this directory (made if missing):
    /// `{section}-{chart}.svg`, e.g. `redis-throughput.svg`, linked under each section of the
    /// markdown (by this path as given).
    #[arg(long, value_name = "DIR")]
    pub(crate) charts: Option<PathBuf>,
    /// With `--rtt` and `--charts`: the loopback run's `--charts` directory. Every chart of
    /// this run whose data that run left there (`{section}-{chart}.json`, written beside each
    /// SVG) is also drawn with both runs' figures, `{section}-{chart}-both.svg`: per row each
    /// peer's loopback bar in its colour beside its bar at this distance in a lighter tint,
    /// on the same log axis; linked first under each section ("Charts, loopback beside 1 ms
    /// round trip:"). A chart without its loopback data is drawn at this distance only.
    #[arg(long, value_name = "DIR", requires_all = ["rtt", "charts"])]
    pub(crate) loopback_charts: Option<PathBuf>,
    /// Seconds one run may take before it is killed (its cell then says "timeout").
    #[arg(long, default_value_t = 300)]
    pub(crate) run_timeout: u64,
    /// Only start the server, print its connect string, and serve until stdin closes (for
    /// running `zklock-bench` and `peers/run` by hand).
    #[arg(long)]
    pub(crate) serve: bool,
    /// ZooKeeper without fsync (`forceSync=no`): quick runs only. By default the suite's server
    /// fsyncs its log before it acknowledges a write, as production servers do.
    #[arg(long)]
    pub(crate) no_fsync: bool,
    /// Run one section only: `zookeeper`, `redis`, `sentinel` (Redis under Sentinel),
    /// `cluster` (Redis Cluster), `postgres`, `mysql` (MySQL / MariaDB), `etcd`, or `tls`
    /// (zklock with mutual TLS beside plaintext on ZooKeeper, Redis, PostgreSQL and etcd).
    #[arg(long)]
    pub(crate) only: Option<Section>,
    /// How many rounds every section runs, its peers taking turns; each cell shows its median
    /// run, each ratio the median of the rounds' ratios (default: ZooKeeper 3, Redis,
    /// Sentinel and Cluster 7, PostgreSQL 5, MySQL 5, etcd 5, TLS 7; 1 with `--quick`).
    #[arg(long)]
    pub(crate) rounds: Option<usize>,
    /// Network distance: every client reaches the servers through a relay (the test kit's
    /// `Delay`) that adds this round trip, half each way, e.g. `1ms`, `500us`, `2ms`; each
    /// section then also shows the round trips per cycle the relays counted. Not the TLS
    /// section, which stays on loopback. Default: none (loopback).
    #[arg(long, value_name = "DURATION", value_parser = crate::distance::parse_rtt)]
    pub(crate) rtt: Option<Duration>,
}

impl Cli {
    /// The rounds of `section`: its runs are short on Redis, PostgreSQL, MySQL and etcd, so
    /// they take more turns; the ZooKeeper section's take minutes each.
    pub(crate) fn rounds(&self, section: Section) -> usize {
        let default = match (self.quick, section) {
            (true, _) => 1,
            (false, Section::Zookeeper) => 3,
            (false, Section::Redis | Section::Sentinel | Section::Cluster) => 7,
            (false, Section::Postgres | Section::Mysql | Section::Etcd) => 5,
            (false, Section::Tls) => 7,
        };
        self.rounds.unwrap_or(default).max(1)
    }

    /// The relays `section` runs behind: at `--rtt`'s distance, or none (loopback; the TLS
    /// section always).
    pub(crate) fn distance(&self, section: Section) -> Distance {
        Distance::new(self.rtt.filter(|_| section.goes_far()))
    }

    /// Whether `section` runs.
    pub(crate) fn runs(&self, section: Section) -> bool {
        self.only.is_none_or(|only| only == section)
    }
}

/// A section of the suite: the backend its rows run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Section {
    /// ZooKeeper: zklock beside the floor, zookeeper-client, Curator, kazoo and the naive herd.
    Zookeeper,
    /// Redis: zklock's Redis backend beside rslock and a `SET NX PX` floor.
    Redis,
    /// Redis under Sentinel: a primary, 2 replicas, 3 Sentinels.
    Sentinel,
    /// Redis Cluster: 3 primaries with a replica each.
    Cluster,
    /// PostgreSQL: zklock's PostgreSQL backend beside a `pg_advisory_lock` floor.
    Postgres,
    /// MySQL / MariaDB: zklock's MySQL backend beside a `GET_LOCK` floor.
    Mysql,
    /// etcd: zklock's etcd backend beside a put-on-a-lease floor and etcd's lock service.
    Etcd,
    /// What TLS costs: zklock with mutual TLS beside plaintext, on each backend.
    Tls,
}

impl Section {
    /// Whether the section runs at `--rtt`'s distance (all but TLS, which stays on loopback).
    pub(crate) fn goes_far(self) -> bool {
        self != Section::Tls
    }

    /// Its name on the command line (`--only`), lowercase: the first part of its charts' file
    /// names.
    pub(crate) fn slug(self) -> &'static str {
        match self {
            Section::Zookeeper => "zookeeper",
            Section::Redis => "redis",
            Section::Sentinel => "sentinel",
            Section::Cluster => "cluster",
            Section::Postgres => "postgres",
            Section::Mysql => "mysql",
            Section::Etcd => "etcd",
            Section::Tls => "tls",
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::ValueEnum as _;

    use super::Section;

    #[test]
    fn a_sections_slug_is_its_name_on_the_command_line() {
        for section in Section::value_variants() {
            let value = section.to_possible_value().unwrap();
            assert_eq!(section.slug(), value.get_name());
        }
    }
}
