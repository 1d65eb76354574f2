//! Running one cell: a child process (`zklock-bench`, the test kit's `peers/run`, or
//! `java CuratorMem`) whose last output line is the cell's report.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use zklock_bench::parse_line;

use crate::distance::{Distance, Trace};
use crate::model::{Cells, Outcome, Row, Runner};

/// Where a section's runs go, and what they need.
pub(crate) struct Env {
    pub(crate) connect: String,
    /// `zklock-bench`, next to this binary.
    pub(crate) bench: PathBuf,
    /// The test kit's `peers/run` (ZooKeeper only).
    pub(crate) peers_run: PathBuf,
    /// Where `CuratorMem` compiled to, once it has.
    pub(crate) java_classes: Option<PathBuf>,
    /// How long one run may take.
    pub(crate) timeout: Duration,
    /// The server's process id, when the suite started it: `zklock-bench`'s runs on `connect`
    /// then also report the server's CPU time per cycle.
    pub(crate) server_pid: Option<u32>,
    /// The relays in front of the servers (none on loopback): each run's report gets their
    /// round trips per cycle.
    pub(crate) distance: Distance,
    pub(crate) scratch: tempfile::TempDir,
}

/// Curator's jars, as Debian installs them.
const CURATOR_CP: &str = "/usr/share/java/curator-recipes.jar:/usr/share/java/curator-framework.jar:/usr/share/java/curator-client.jar:/usr/share/java/zookeeper.jar:/usr/share/java/zookeeper-jute.jar:/usr/share/java/guava.jar:/usr/share/java/slf4j-api.jar:/usr/share/java/netty-all.jar";

impl Env {
    /// An environment for `connect` with `zklock-bench` next to this binary.
    pub(crate) fn new(connect: String, timeout: Duration) -> Result<Env, String> {
        let bench = std::env::current_exe()
            .map_err(|e| e.to_string())?
            .with_file_name("zklock-bench");
        if !bench.exists() {
            return Err(format!("{} is missing: build the crate", bench.display()));
        }
        Ok(Env {
            connect,
            bench,
            peers_run: PathBuf::new(),
            java_classes: None,
            timeout,
            server_pid: None,
            distance: Distance::default(),
            scratch: tempfile::tempdir().map_err(|e| e.to_string())?,
        })
    }

    fn command(&self, row: &Row, runner: &Runner) -> Result<Command, String> {
        let (n, m) = (row.workers.to_string(), row.cycles.to_string());
        Ok(match runner {
            Runner::Ours {
                peer,
                no_queue,
                no_tokens,
            } => {
                let mut cmd = Command::new(&self.bench);
                cmd.args(["--connect", &self.connect, "--workload", row.workload])
                    .args(["--workers", &n, "--cycles", &m, "--peer", peer])
                    .args(["--keys", &row.keys.to_string()]);
                if *no_queue {
                    cmd.arg("--no-local-queue");
                }
                if *no_tokens {
                    cmd.arg("--no-fencing-tokens");
                }
                self.server_pid_arg(&mut cmd);
                cmd
            }
            Runner::OursAt { peer, connect } => {
                let mut cmd = Command::new(&self.bench);
                cmd.args(["--connect", connect, "--workload", row.workload])
                    .args(["--workers", &n, "--cycles", &m, "--peer", peer])
                    .args(["--keys", &row.keys.to_string()]);
                cmd
            }
            Runner::On(server) => {
                let mut cmd = Command::new(&self.bench);
                cmd.args(["--connect", &server.connect, "--workload", row.workload])
                    .args(["--workers", &n, "--cycles", &m, "--peer", "zklock"])
                    .args(["--keys", &row.keys.to_string()]);
                if let Some(pid) = server.pid {
                    cmd.args(["--server-pid", &pid.to_string()]);
                }
                if let Some(tls) = &server.tls {
                    cmd.arg("--tls-ca").arg(&tls.ca);
                    cmd.arg("--tls-cert").arg(&tls.cert);
                    cmd.arg("--tls-key").arg(&tls.key);
                }
                cmd
            }
            Runner::Acked(replicas) => {
                let mut cmd = Command::new(&self.bench);
                cmd.args(["--connect", &self.connect, "--workload", row.workload])
                    .args(["--workers", &n, "--cycles", &m, "--peer", "zklock"])
                    .args(["--keys", &row.keys.to_string()])
                    .args(["--replica-acks", &replicas.to_string()]);
                self.server_pid_arg(&mut cmd);
                cmd
            }
            Runner::Peer(which) => {
                let mut cmd = Command::new(&self.peers_run);
                cmd.args([which, self.connect.as_str(), row.workload, &n, &m]);
                if row.workload == "keys" {
                    cmd.arg(row.keys.to_string());
                }
                cmd
            }
            Runner::CuratorMem => {
                let classes = self
                    .java_classes
                    .as_ref()
                    .ok_or("CuratorMem did not compile")?;
                let mut cmd = Command::new("java");
                cmd.arg("-Xss256k")
                    .arg("-cp")
                    .arg(format!("{CURATOR_CP}:{}", classes.display()))
                    .args(["CuratorMem", &self.connect, row.workload, &n]);
                cmd
            }
        })
    }

    /// Asks a run of `zklock-bench` on `connect` for the server's CPU time, when its process
    /// is known.
    fn server_pid_arg(&self, cmd: &mut Command) {
        if let Some(pid) = self.server_pid {
            cmd.args(["--server-pid", &pid.to_string()]);
        }
    }

    /// Runs one cell and waits for it (killed after the timeout); at a distance, its report
    /// also gives the round trips per cycle the relays counted.
    pub(crate) fn run(&self, row: &Row, runner: &Runner) -> Outcome {
        let mut trace = Trace::default();
        let late = self.distance.late();
        let mut report = self.run_child(row, runner, &mut trace)?;
        self.distance.record(&mut report, &trace, late);
        Ok(report)
    }

    /// Runs one cell's child process and waits for it (killed after the timeout), tracing the
    /// relays' round trips meanwhile.
    fn run_child(&self, row: &Row, runner: &Runner, trace: &mut Trace) -> Outcome {
        let mut cmd = self.command(row, runner)?;
        let out_path = self.scratch.path().join("stdout");
        let err_path = self.scratch.path().join("stderr");
        let out = std::fs::File::create(&out_path).map_err(|e| e.to_string())?;
        let err = std::fs::File::create(&err_path).map_err(|e| e.to_string())?;
        let shown = format!("{cmd:?}");
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("{shown}: {e}"))?;
        let deadline = Instant::now() + self.timeout;
        let status = loop {
            self.distance.sample(trace);
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() > deadline => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err("timeout".into());
                }
                Ok(None) => std::thread::sleep(self.distance.poll()),
                Err(e) => return Err(e.to_string()),
            }
        };
        let stdout = std::fs::read_to_string(&out_path).unwrap_or_default();
        let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
        match stdout.lines().rev().find_map(parse_line) {
            Some(report) if status.success() => Ok(report),
            _ => {
                let tail: Vec<&str> = stderr.lines().rev().take(5).collect();
                Err(format!(
                    "{status}: {}",
                    tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
                ))
            }
        }
    }

    /// Runs one cell and prints its line (or failure) to stderr.
    pub(crate) fn run_shown(&mut self, row: &Row, column: &str, runner: &Runner) -> Outcome {
        if matches!(runner, Runner::CuratorMem) && self.java_classes.is_none() {
            // peers/run has installed the Curator jars by now.
            match compile_curator_mem(self.scratch.path()) {
                Ok(classes) => self.java_classes = Some(classes),
                Err(e) => eprintln!("CuratorMem: {e}"),
            }
        }
        let t0 = Instant::now();
        let outcome = self.run(row, runner);
        let took = t0.elapsed().as_secs_f64();
        match &outcome {
            Ok(report) => eprintln!("[{took:>5.1}s] {report}"),
            Err(e) => eprintln!("[{took:>5.1}s] {} / {column}: FAILED {e}", row.title),
        }
        outcome
    }

    /// Runs every cell of `rows` once, one at a time.
    pub(crate) fn run_rows(&mut self, rows: &[Row]) -> Vec<Cells> {
        rows.iter()
            .map(|row| {
                row.cells
                    .iter()
                    .map(|(column, runner)| (*column, self.run_shown(row, column, runner)))
                    .collect()
            })
            .collect()
    }
}

fn compile_curator_mem(into: &Path) -> Result<PathBuf, String> {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("java/CuratorMem.java");
    let classes = into.join("classes");
    std::fs::create_dir_all(&classes).map_err(|e| e.to_string())?;
    let out = Command::new("javac")
        .arg("-d")
        .arg(&classes)
        .args(["-cp", CURATOR_CP])
        .arg(&source)
        .output()
        .map_err(|e| format!("javac: {e}"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(classes)
}
