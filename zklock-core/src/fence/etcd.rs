//! The fence on etcd: one transaction per write compares the token key with the write's token
//! and either reads the newer token back or applies your operations and records the token.

use std::fmt;
use std::future::Future;

use etcd_client::{Client, Compare, CompareOp, KvClient, Txn, TxnOp, TxnOpResponse};

use super::encoding::SORTABLE_BYTES_LEN;
use super::error::FenceError;
use super::{check_write, Fence, Outcome};
use crate::types::token::FencingToken;

/// The default prefix of the keys that hold the last accepted tokens.
pub(crate) const DEFAULT_PREFIX: &str = "zklock/fence/";

const EXPECTED: &str = "12 bytes (FencingToken::to_sortable_bytes)";

/// Fenced transactions on etcd: your puts and deletes applied in the same transaction that
/// checks and advances the resource's token, so the check, your write and the new token are
/// one atomic step.
///
/// The last accepted token of a resource is kept in the key `prefix + resource` (default
/// prefix `zklock/fence/`, so a lock path `/zklock/locks/sku_7` has the token key
/// `zklock/fence//zklock/locks/sku_7`; the resource's bytes are used as they are, so two
/// resources never share a key), as [`FencingToken::to_sortable_bytes`]' 12 bytes, which
/// etcd compares as bytes in the token's order.
///
/// A write with token `t` is one transaction:
///
/// ```text
/// if   create_revision(key) > 0  and  value(key) > t      // a newer token was accepted
/// then get(key)                                           // -> Outcome::Stale { last }
/// else your operations..., put(key, t)                    // -> Outcome::Accepted(responses)
/// ```
///
/// etcd evaluates the comparison and runs the chosen branch at one revision, so nothing can
/// come between the check and the write: an absent key and a key holding a token up to `t`
/// both take the `else` branch, and the token read back on refusal is the one the refusal was
/// decided on. There is no read before the transaction, so no race to lose and nothing to
/// retry: under any number of concurrent writers each write takes one round trip, and the
/// newest token's write is never turned away.
///
/// An accepted write overwrites the token key without looking at what it held; keep the
/// token keys for the fence alone. Something else there that compares above `t` is reported as
/// [`FenceError::Encoding`] (nothing applied), as it is by [`last_token`](Fence::last_token).
/// Your operations must not touch the token key: etcd refuses a transaction that writes a key
/// twice ([`FenceError::Etcd`], nothing applied).
///
/// ```no_run
/// # async fn run(manager: zklock_core::LockManager) -> Result<(), Box<dyn std::error::Error>> {
/// use zklock_core::fence::{EtcdFence, EtcdWrite, Outcome};
///
/// let client = etcd_client::Client::connect(["127.0.0.1:2379"], None).await?;
/// let fence = EtcdFence::new(client);
/// let guard = manager.lock("sku_7").await?;
/// let sell = EtcdWrite::new()
///     .put("shop/stock/sku_7", "41")
///     .delete("shop/reserved/sku_7/order-9");
/// match guard.fenced(&fence).write(sell).await? {
///     Outcome::Accepted(responses) => assert_eq!(responses.len(), 2),
///     // A newer holder wrote meanwhile: this one lost its lock while paused.
///     Outcome::Stale { last } => eprintln!("refused: {last} was accepted"),
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct EtcdFence {
    kv: KvClient,
    prefix: String,
}

impl fmt::Debug for EtcdFence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdFence")
            .field("prefix", &self.prefix)
            .finish()
    }
}

/// Your operations of one fenced etcd transaction, applied in order only if the token passes.
/// Their responses come back in the same order in [`Outcome::Accepted`] (the fence's own put
/// of the token is not among them).
///
/// Any [`TxnOp`] goes: puts with options (a lease, ...), deletes of ranges, reads, nested
/// transactions. None may write the fence's token key, and no key may be written twice (etcd
/// refuses such a transaction as a whole).
///
/// ```
/// use etcd_client::{DeleteOptions, TxnOp};
/// use zklock_core::fence::EtcdWrite;
///
/// let write = EtcdWrite::new()
///     .put("shop/stock/sku_7", "41")
///     .delete("shop/reserved/sku_7/order-9")
///     .op(TxnOp::delete("shop/cache/sku_7/", Some(DeleteOptions::new().with_prefix())));
/// assert_eq!(write.len(), 3);
/// let same = EtcdWrite::ops(vec![TxnOp::put("shop/stock/sku_7", "41", None)]);
/// assert_eq!(same.len(), 1);
/// ```
#[derive(Debug, Clone, Default)]
pub struct EtcdWrite {
    ops: Vec<TxnOp>,
}

impl EtcdWrite {
    /// No operations yet: applied as it is, it only records the token (a holder claiming the
    /// resource before it writes anything).
    ///
    /// ```
    /// assert!(zklock_core::fence::EtcdWrite::new().is_empty());
    /// ```
    pub fn new() -> EtcdWrite {
        EtcdWrite::default()
    }

    /// Your own operations, in order.
    ///
    /// ```
    /// use etcd_client::{PutOptions, TxnOp};
    ///
    /// // A put that keeps the key's lease, which a plain put would drop.
    /// let write = zklock_core::fence::EtcdWrite::ops(vec![TxnOp::put(
    ///     "workers/w-1/state",
    ///     "draining",
    ///     Some(PutOptions::new().with_ignore_lease()),
    /// )]);
    /// assert_eq!(write.len(), 1);
    /// ```
    pub fn ops(ops: Vec<TxnOp>) -> EtcdWrite {
        EtcdWrite { ops }
    }

    /// Adds `put key value`.
    ///
    /// ```
    /// let write = zklock_core::fence::EtcdWrite::new().put("config/limits", b"{\"rps\":50}".to_vec());
    /// assert_eq!(write.len(), 1);
    /// ```
    pub fn put(self, key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> EtcdWrite {
        self.op(TxnOp::put(key, value, None))
    }

    /// Adds the delete of the one key `key` (a missing key is no error: etcd deletes nothing
    /// and says so in the response). Delete a range with [`op`](Self::op) and
    /// `DeleteOptions`.
    ///
    /// ```
    /// let write = zklock_core::fence::EtcdWrite::new().delete("jobs/pending/42");
    /// assert_eq!(write.len(), 1);
    /// ```
    pub fn delete(self, key: impl Into<Vec<u8>>) -> EtcdWrite {
        self.op(TxnOp::delete(key, None))
    }

    /// Adds any operation.
    ///
    /// ```
    /// use etcd_client::TxnOp;
    ///
    /// // Read a key in the same transaction: its value as of the fenced write.
    /// let write = zklock_core::fence::EtcdWrite::new()
    ///     .put("counters/sku_7", "9")
    ///     .op(TxnOp::get("counters/sku_8", None));
    /// assert_eq!(write.len(), 2);
    /// ```
    pub fn op(mut self, op: TxnOp) -> EtcdWrite {
        self.ops.push(op);
        self
    }

    /// How many operations it has.
    ///
    /// ```
    /// assert_eq!(zklock_core::fence::EtcdWrite::new().put("a", "1").len(), 1);
    /// ```
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether it has no operations.
    ///
    /// ```
    /// assert!(!zklock_core::fence::EtcdWrite::new().delete("a").is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}

impl From<Vec<TxnOp>> for EtcdWrite {
    /// [`EtcdWrite::ops`].
    ///
    /// ```
    /// let write: zklock_core::fence::EtcdWrite = vec![etcd_client::TxnOp::delete("k", None)].into();
    /// assert_eq!(write.len(), 1);
    /// ```
    fn from(ops: Vec<TxnOp>) -> EtcdWrite {
        EtcdWrite::ops(ops)
    }
}

impl EtcdFence {
    /// A fence on `client` (etcd-client 0.21) with the default key prefix `zklock/fence/`.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let client = etcd_client::Client::connect(["127.0.0.1:2379"], None).await?;
    /// let fence = zklock_core::fence::EtcdFence::new(client);
    /// assert_eq!(fence.key_of("sku_7"), "zklock/fence/sku_7");
    /// # Ok(()) }
    /// ```
    pub fn new(client: Client) -> EtcdFence {
        EtcdFence {
            kv: client.kv_client(),
            prefix: DEFAULT_PREFIX.to_string(),
        }
    }

    /// Keeps the tokens under `prefix + resource` instead (e.g. under your application's own
    /// prefix, where its role may write).
    ///
    /// ```no_run
    /// # fn run(client: etcd_client::Client) {
    /// let fence = zklock_core::fence::EtcdFence::new(client).with_prefix("shop/fence/");
    /// assert_eq!(fence.key_of("sku_7"), "shop/fence/sku_7");
    /// # }
    /// ```
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> EtcdFence {
        self.prefix = prefix.into();
        self
    }

    /// The key holding the last accepted token of `resource`: the prefix, then the resource's
    /// bytes as they are.
    ///
    /// ```no_run
    /// # fn run(client: etcd_client::Client) {
    /// let fence = zklock_core::fence::EtcdFence::new(client);
    /// assert_eq!(fence.key_of("/zklock/locks/sku 7"), "zklock/fence//zklock/locks/sku 7");
    /// # }
    /// ```
    pub fn key_of(&self, resource: &str) -> String {
        format!("{}{resource}", self.prefix)
    }

    async fn write(
        &self,
        resource: &str,
        token: FencingToken,
        write: EtcdWrite,
    ) -> Result<Outcome<Vec<TxnOpResponse>>, FenceError> {
        check_write(resource, token)?;
        let key = self.key_of(resource);
        let bytes = token.to_sortable_bytes();
        let mut accept = write.ops;
        let yours = accept.len();
        accept.push(TxnOp::put(key.clone(), bytes, None));
        let txn = Txn::new()
            // Both must hold to refuse: the key exists, and its token is newer than this one.
            // An absent key fails the first, so the first write is accepted (etcd also fails a
            // value comparison on a missing key; the first comparison does not rely on it).
            .when([
                Compare::create_revision(key.clone(), CompareOp::Greater, 0),
                Compare::value(key.clone(), CompareOp::Greater, bytes),
            ])
            .and_then([TxnOp::get(key.clone(), None)])
            .or_else(accept);
        let reply = self.kv.clone().txn(txn).await?;
        let mut responses = reply.op_responses();
        if !reply.succeeded() {
            responses.truncate(yours);
            return Ok(Outcome::Accepted(responses));
        }
        // The refusing branch's one read, at the revision the comparison was made at.
        match responses.pop() {
            Some(TxnOpResponse::Get(get)) if get.kvs().len() == 1 => Ok(Outcome::Stale {
                last: parse(&key, get.kvs()[0].value())?,
            }),
            other => Err(FenceError::Encoding {
                found: format!("{other:?}"),
                expected: "the read of the token key in the refusing branch",
            }),
        }
    }
}

/// The token in a token key's value.
fn parse(key: &str, value: &[u8]) -> Result<FencingToken, FenceError> {
    if value.len() != SORTABLE_BYTES_LEN {
        return Err(FenceError::Encoding {
            found: format!("{value:02x?} in {key:?}"),
            expected: EXPECTED,
        });
    }
    FencingToken::from_sortable_bytes(value)
}

impl Fence for EtcdFence {
    type Write = EtcdWrite;
    /// The responses to your operations, in order.
    type Applied = Vec<TxnOpResponse>;

    fn fenced_write(
        &self,
        resource: &str,
        token: FencingToken,
        write: EtcdWrite,
    ) -> impl Future<Output = Result<Outcome<Vec<TxnOpResponse>>, FenceError>> + Send {
        self.write(resource, token, write)
    }

    fn last_token(
        &self,
        resource: &str,
    ) -> impl Future<Output = Result<Option<FencingToken>, FenceError>> + Send {
        let key = self.key_of(resource);
        let mut kv = self.kv.clone();
        async move {
            let reply = kv.get(key.clone(), None).await?;
            match reply.kvs().first() {
                None => Ok(None),
                Some(found) => Ok(Some(parse(&key, found.value())?)),
            }
        }
    }
}
