//! The `#[distributed_lock]` attribute of zklock. Use it through the `zklock` crate:
//! `use zklock::distributed_lock;`.
//!
//! `lib.rs` is the entry point only: `attr.rs` parses the arguments, `template.rs` scans key
//! templates, `expand.rs` builds the tokens.
mod attr;
mod expand;
mod template;
#[cfg(test)]
mod tests;

use proc_macro::TokenStream;

/// Runs an `async fn`'s body under a distributed lock on a key built from its arguments.
///
/// The lock is taken before the body starts and released when it ends, on every path: return,
/// `?`, panic, and cancellation (dropping the call's future). Annotated calls in other
/// processes or sessions with the same key wait for each other; a nested annotated call on a
/// key the caller already holds re-enters instead of waiting for itself.
///
/// ```no_run
/// use zklock::distributed_lock;
///
/// #[derive(Debug)]
/// enum ShopError { SoldOut, Lock(zklock::Error) }
///
/// impl From<zklock::Error> for ShopError {
///     fn from(err: zklock::Error) -> Self { ShopError::Lock(err) }
/// }
///
/// #[distributed_lock("sku_{sku}")]
/// async fn sell(sku: u64, quantity: u32) -> Result<u32, ShopError> {
///     // read the stock, check it, write it: no other instance runs this for `sku` meanwhile
///     let token = zklock::current_fencing_token(); // send it with the write
///     # let _ = token;
///     Ok(quantity)
/// }
/// ```
///
/// # What it goes on
///
/// An `async fn` with a body: a free fn, an inherent or trait-impl method, or a provided
/// method of a trait (any receiver: `&self`, `&mut self`, `self`, `self: Arc<Self>`), generic
/// or not. Its return type must be
/// spelled as a `Result` (`Result<T, E>`, `std::result::Result<T, E>`, `zklock::Result<T>`,
/// or an alias whose name ends in `Result`, such as `AppResult<T>`), with
/// `E: From<zklock::Error>`: the lock's own errors (timeout, lost hold, invalid key, no
/// manager) are returned through it. The signature is kept as written.
///
/// # The key template
///
/// The first argument, a string literal. Placeholders name the fn's parameters and are filled
/// in with [`Display`](std::fmt::Display); the result is the lock key, which the core validates
/// and encodes as every key (untrusted input never leaves the lock namespace).
///
/// | template | key for the call |
/// | --- | --- |
/// | `"nightly-report"` | the text itself |
/// | `"user_{id}"` | `user_42` for `id = 42` |
/// | `"user_<id>"` | the same, the other spelling |
/// | `"order_{order.id}"` | a field of a parameter (`{pair.0}` for a tuple field) |
/// | `"{tenant}/{kind}:{id}"` | several placeholders and literal text |
/// | `"account_{self.id}"` | a field of the receiver |
/// | `"a {{b}} <<c>>"` | `a {b} <c>`: doubled braces and angle brackets are literal |
///
/// Names bound by destructuring parameters (`(a, b): (u8, u8)`) count as parameters. Format
/// specs (`{id:?}`) are refused: the key always uses `Display`.
///
/// ```no_run
/// use zklock::{distributed_lock, Error};
///
/// pub struct Order { pub id: u64, pub user_id: u64 }
///
/// #[distributed_lock("user_{order.user_id}")]
/// async fn checkout(order: Order) -> Result<u64, Error> {
///     Ok(order.id)
/// }
///
/// #[distributed_lock("{tenant}:invoice_<number>")]
/// async fn issue(tenant: &str, number: u32) -> zklock::Result<()> {
///     Ok(())
/// }
/// ```
///
/// # Options
///
/// After the template, `name = value` pairs in any order, each at most once. Values are string
/// literals, except `manager`, which is an expression.
///
/// | option | values | default |
/// | --- | --- | --- |
/// | `mode` | `"exclusive"`, `"read"` (shared), `"write"` | `"exclusive"` |
/// | `timeout` | how long to wait for the lock: whole numbers with units `ms`, `s`, `m`, `h`, as in `"500ms"`, `"5s"`, `"1m30s"`; checked at compile time | wait forever |
/// | `manager` | the `LockManager` to use: a static (`LazyLock`/`once_cell` `Lazy`), a parameter or field (`LockManager`, `&LockManager`, `Arc<LockManager>`), or any expression giving one of those | the global manager, `zklock::global()` |
/// | `on_lost` | `"abort"`: when the hold is lost while the body runs, the body is dropped at its next await and `Error::LockLost` is returned; `"continue"`: the body finishes and its result is returned | `"abort"` |
/// | `crate` | the path of the zklock crate when Cargo.toml renames it, as in `"my_zklock"` | `"::zklock"` |
/// | `skip_if_locked` | no value: the fn is a [scheduled job](#scheduled-jobs) that skips the call when another instance holds it | wait |
/// | `at_least` | a job's window, a duration written as for `timeout`: no other run starts within that long of a run's start, even after it ended or its process exited | none |
/// | `at_most` | a job's limit, a duration written as for `timeout`: a run still going after that long is stopped and its lock given up | none |
///
/// A `timeout` that runs out returns `zklock::Error::Timeout`, and nothing is left behind
/// (in a job, it is a skip).
///
/// ```no_run
/// use std::sync::LazyLock;
/// use zklock::{distributed_lock, Error, LockManager};
///
/// static LOCKS: LazyLock<LockManager> = LazyLock::new(|| {
///     // e.g. connected in main and stored; here for brevity
///     unimplemented!()
/// });
///
/// #[distributed_lock("catalog_{id}", mode = "read", manager = LOCKS)]
/// async fn show(id: u32) -> Result<String, Error> {
///     Ok(format!("item {id}"))
/// }
///
/// #[distributed_lock("catalog_{id}", mode = "write", timeout = "5s", manager = LOCKS)]
/// async fn edit(id: u32, text: String) -> Result<(), Error> {
///     let _ = (id, text);
///     Ok(())
/// }
///
/// #[distributed_lock("report", timeout = "500ms", on_lost = "continue", manager = LOCKS)]
/// async fn report() -> Result<(), Error> {
///     Ok(())
/// }
/// ```
///
/// Methods name their manager through `self`, and generic fns work as any other:
///
/// ```no_run
/// use std::fmt::Display;
/// use zklock::{distributed_lock, Error, LockManager};
///
/// struct Accounts { locks: LockManager }
///
/// impl Accounts {
///     #[distributed_lock("account_{id}", manager = self.locks)]
///     async fn debit(&self, id: u64, cents: u64) -> Result<u64, Error> {
///         Ok(cents)
///     }
/// }
///
/// trait Jobs {
///     async fn run(&self, name: &str) -> Result<(), Error>;
/// }
///
/// impl Jobs for Accounts {
///     #[distributed_lock("job_{name}", manager = &self.locks, timeout = "10s")]
///     async fn run(&self, name: &str) -> Result<(), Error> {
///         Ok(())
///     }
/// }
///
/// #[distributed_lock("item_{key}", manager = locks)]
/// async fn touch<K: Display + Send>(locks: &LockManager, key: K) -> Result<(), Error> {
///     Ok(())
/// }
/// ```
///
/// With a renamed dependency (`my_zklock = { package = "zklock", ... }` in Cargo.toml):
///
/// ```no_run
/// # extern crate zklock as my_zklock;
/// #[my_zklock::distributed_lock("user_{id}", crate = "my_zklock")]
/// async fn handler(id: u64) -> my_zklock::Result<u64> {
///     Ok(id)
/// }
/// ```
///
/// # Scheduled jobs
///
/// Every instance's cron fires; one runs the job, the others skip it (ShedLock's purpose).
/// With `skip_if_locked`, `at_least` or `at_most`, the fn runs as the job of its key,
/// `LockManager::job(key)` with those
/// settings (see `zklock::Job` for what each one guarantees): a lock of its own, apart from `manager.lock(key)` and from an annotated fn without job options on
/// the same key, shared with every job of that name (`zklock exec KEY --skip-if-locked` too).
///
/// A call of a job either runs the body or is skipped, and the return type says how a skip
/// comes back:
///
/// | return type | the body returns | a skip returns |
/// | --- | --- | --- |
/// | `Result<zklock::Ran<T>, E>` (or `zklock::Result<Ran<T>>`, `AppResult<Ran<T>>`...) | `Result<T, E>`; its `Ok(v)` comes back as `Ok(Ran::Ran(v))` | `Ok(Ran::Skipped)` |
/// | any other `Result<T, E>` | `Result<T, E>` | `Err(zklock::Error::JobSkipped { .. }.into())` |
///
/// `at_least` and `at_most` need the call's choice when another instance holds the job:
/// `skip_if_locked` (return at once) or `timeout = "5s"` (wait up to that long, then skip;
/// never `Error::Timeout`). A job holds an exclusive lock and stops its body when the hold is
/// lost, so `mode = "read"`/`"write"`, `on_lost = "continue"`, and `skip_if_locked` with
/// `timeout` are compile errors, as is a zero `at_least` or `at_most`.
///
/// ```no_run
/// use zklock::{distributed_lock, Error, Ran};
///
/// // Every instance calls this at 02:00: one sends the report, the others get `Ran::Skipped`.
/// #[distributed_lock("nightly-report", skip_if_locked, at_least = "30s", at_most = "10m")]
/// async fn nightly_report() -> Result<Ran<usize>, Error> {
///     let sent = 42; // build and send the report
///     Ok(sent)
/// }
///
/// // The same job, where a skip is an error to the caller.
/// #[distributed_lock("invoices", timeout = "2s", at_most = "5m")]
/// async fn invoices() -> Result<u32, Error> {
///     Ok(7)
/// }
///
/// # async fn cron() -> Result<(), Error> {
/// match nightly_report().await? {
///     Ran::Ran(sent) => println!("sent {sent} reports"),
///     Ran::Skipped => println!("another instance has it"),
/// }
/// match invoices().await {
///     Err(Error::JobSkipped { .. }) => println!("another instance issued them"),
///     other => println!("issued {:?}", other?),
/// }
/// # Ok(()) }
/// ```
///
/// Backends: on ZooKeeper, every option; `at_least` is kept in a persistent run record beside
/// the job's lock path, measured by the server's clock (the record's mtime), so instances with
/// skewed clocks and processes that exit do not shorten it. On Redis, every option; the window
/// is measured by the server's `TIME`. On PostgreSQL, every option; the window is a column of
/// the key table, measured by the server's clock. In memory (`LockManager::in_memory`, for unit tests),
/// every option, measured by the process's clock and kept only while the manager lives.
/// `skip_if_locked` and `at_most` rest on the lock alone; `at_least` needs the backend's run
/// record, and a backend without one refuses it with `Error::Unsupported` naming itself.
///
/// # The fencing token
///
/// Inside the body, `zklock::current_fencing_token()` returns the token of the innermost hold,
/// and `zklock::fence::current(&store)` a writer that carries it: the store (PostgreSQL, Redis,
/// ZooKeeper, or `MemoryFence` in tests) then applies a write only if no newer holder of the
/// lock wrote since, so a holder paused past its session or lease cannot write stale data.
///
/// ```
/// use zklock::distributed_lock;
/// use zklock::fence::{MemoryFence, Outcome};
///
/// #[distributed_lock("sku_{sku}", manager = manager)]
/// async fn restock(
///     manager: &zklock::LockManager,
///     store: &MemoryFence<i64>,
///     sku: u64,
///     units: i64,
/// ) -> Result<Outcome, Box<dyn std::error::Error>> {
///     let writer = zklock::fence::current(store).expect("inside the lock");
///     Ok(writer.write(units).await?)
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let manager = zklock::LockManager::in_memory();
/// let store = MemoryFence::new();
/// assert_eq!(restock(&manager, &store, 7, 40).await?, Outcome::Accepted(()));
/// assert_eq!(store.value(&manager.path_of("sku_7")?), Some(40));
/// # Ok(()) }
/// ```
///
/// # Compile errors
///
/// Each points at the offending token: a fn that is not `async` (at `fn`), a return type that
/// is not a `Result` (at the type), a placeholder that names no parameter or is malformed (at
/// the template), an unknown or repeated option (at its name), a bad `mode`, `timeout`,
/// `on_lost`, `crate`, `at_least` or `at_most` value (at the value), a value given to
/// `skip_if_locked` (at the value), and a job option with one it cannot go with (at the other
/// option: `timeout`'s name, `mode`'s or `on_lost`'s value, or at `at_least`/`at_most` when
/// neither `skip_if_locked` nor `timeout` says what a call does when the job is held). An error type without
/// `From<zklock::Error>` is blamed on the return type, a placeholder value without `Display`
/// on the template, and a `manager` that is not a manager on its expression. The fn itself is
/// still emitted, so that no other errors follow from the missing fn.
///
/// # What it expands to
///
/// The key is formatted and the manager looked up before the body runs; the body becomes an
/// `async move` block run by `zklock::__private::run` (which takes the lock, runs the body in a
/// reentrancy frame, and releases the lock however the body ends). A handler from the
/// crate's snapshot test, `snapshots/handler.rs`:
///
/// ```ignore
#[doc = include_str!("../snapshots/handler.rs")]
/// ```
///
/// expands to (`snapshots/handler.expanded.rs`, which the UI tests compile as plain code):
///
/// ```ignore
#[doc = include_str!("../snapshots/handler.expanded.rs")]
/// ```
///
/// The `if false { ... return __zklock_fake_return; }` block never runs: it gives the body the
/// fn's return type, so that `?` and `return` inside it infer against the signature, and a
/// mismatch is reported there. Locals are prefixed `__zklock_` and hygienic.
#[proc_macro_attribute]
pub fn distributed_lock(attr: TokenStream, item: TokenStream) -> TokenStream {
    expand::distributed_lock(attr.into(), item.into()).into()
}
