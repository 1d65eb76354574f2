//! The inventory HTTP service: place an order = read stock, check it, write stock, record the
//! order; under the SKU's distributed lock, with the write fenced by the lock's token.
//!
//! | route | what |
//! | --- | --- |
//! | `POST /skus/{sku}/orders` | place an order for one unit; body `{"order_id": "..."}` |
//! | `GET /skus/{sku}` | the stock left |
//! | `GET /health` | `ok` |
//! | `GET /metrics` | zklock's metrics (`zklock_*`), Prometheus text format |
//!
//! An order answers `200` sold, `409` out of stock or fenced (a stale write refused by the
//! store), `404` unknown SKU, `503` when the lock or the store failed; always with an
//! [`OrderResponse`] body.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use serde::{Deserialize, Serialize};
use zklock::fence::{FenceError, Fenced, RedisFence};
use zklock::{distributed_lock, FencingToken, LockManager};

use crate::store::{Store, WriteOutcome};

/// The Redis list the service pushes to when it holds a lock for a debug-hold order (see
/// [`OrderRequest::hold`]); an entry is `"<instance> <order_id> <token> <stock read>"`.
pub const HOLDING_EVENTS: &str = "debug:holding";

/// The Redis list a debug-hold order waits on before it writes: push anything to release it.
pub fn release_key(order_id: &str) -> String {
    format!("debug:release:{order_id}")
}

/// The longest a SKU name may be.
pub const MAX_SKU_LEN: usize = 64;

/// How the service is configured.
#[derive(Debug, Clone)]
pub struct Config {
    /// This instance's number, reported in every answer.
    pub instance: u32,
    /// The lock manager; `None` runs without locks (and without fencing), to show the oversell.
    pub manager: Option<LockManager>,
    /// Honour [`OrderRequest::hold`] (for the pause scenario); off in normal service.
    pub debug_hold: bool,
    /// Work done between the read and the write (pricing, payment, ...), simulated by waiting.
    pub work: Duration,
}

/// The shared state of the handlers.
#[derive(Debug, Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    config: Config,
    store: Store,
}

impl AppState {
    /// State over a store.
    pub fn new(config: Config, store: Store) -> AppState {
        AppState {
            inner: Arc::new(Inner { config, store }),
        }
    }
}

/// An order for one unit of a SKU.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct OrderRequest {
    /// The client's id for the order, recorded with it.
    pub order_id: String,
    /// Debug (honoured only when the service runs with `--debug-hold`): once the lock is held
    /// and the stock read, announce it on [`HOLDING_EVENTS`] and wait on [`release_key`]
    /// before writing. The pause scenario freezes the instance meanwhile.
    #[serde(default)]
    pub hold: bool,
}

/// What happened to an order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// One unit sold: stock written, order recorded.
    Sold,
    /// No stock left: nothing written.
    OutOfStock,
    /// The write carried a fencing token older than the store's last: refused, nothing written.
    Fenced,
    /// The SKU is not stocked.
    UnknownSku,
    /// The lock or the store failed.
    Error,
}

/// The answer to an order.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OrderResponse {
    /// What happened.
    pub outcome: Outcome,
    /// The SKU.
    pub sku: String,
    /// The order's id.
    pub order_id: String,
    /// The instance that served it.
    pub instance: u32,
    /// The stock read before the write, if it was read.
    pub stock_read: Option<i64>,
    /// The fencing token of the lock the order ran under (`zxid` or `zxid.local` on ZooKeeper,
    /// the fence counter on Redis, the key row's fence on PostgreSQL).
    pub token: Option<String>,
    /// For a fenced order: the newer token the store had already accepted.
    pub store_token: Option<String>,
    /// For an error: what failed.
    pub error: Option<String>,
}

impl IntoResponse for OrderResponse {
    fn into_response(self) -> Response {
        let status = match self.outcome {
            Outcome::Sold => StatusCode::OK,
            Outcome::OutOfStock | Outcome::Fenced => StatusCode::CONFLICT,
            Outcome::UnknownSku => StatusCode::NOT_FOUND,
            Outcome::Error => StatusCode::SERVICE_UNAVAILABLE,
        };
        (status, Json(self)).into_response()
    }
}

/// Why an order could not be carried out: the lock or the store failed.
#[derive(Debug)]
pub struct OrderError(String);

impl From<zklock::Error> for OrderError {
    fn from(e: zklock::Error) -> OrderError {
        OrderError(format!("lock: {e}"))
    }
}

impl From<FenceError> for OrderError {
    fn from(e: FenceError) -> OrderError {
        OrderError(format!("store: {e}"))
    }
}

impl From<redis::RedisError> for OrderError {
    fn from(e: redis::RedisError) -> OrderError {
        OrderError(format!("redis: {e}"))
    }
}

/// What the critical section found and did.
#[derive(Debug, Clone)]
struct Sale {
    outcome: Outcome,
    stock_read: Option<i64>,
    token: Option<FencingToken>,
    store_token: Option<FencingToken>,
}

/// The process's Prometheus recorder, once [`install_metrics`] ran.
static METRICS: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs a Prometheus recorder for this process (before any `LockManager` is built, so
/// that every metric zklock emits is recorded), with zklock's histogram buckets and help
/// texts, and keeps its histograms trimmed in the background. `GET /metrics` serves it.
/// Must run inside a tokio runtime; a second call does nothing.
///
/// # Errors
/// When another recorder is installed already.
pub fn install_metrics() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    if METRICS.get().is_some() {
        return Ok(());
    }
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Prefix("zklock_".into()),
            zklock::metrics::SECONDS_BUCKETS,
        )?
        .install_recorder()?;
    zklock::metrics::describe();
    let upkeep = handle.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            upkeep.run_upkeep();
        }
    });
    let _ = METRICS.set(handle);
    Ok(())
}

async fn metrics() -> Response {
    match METRICS.get() {
        Some(handle) => (
            [(
                axum::http::header::CONTENT_TYPE,
                "text/plain; version=0.0.4",
            )],
            handle.render(),
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, "no metrics recorder installed").into_response(),
    }
}

/// The routes of the service.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/health", get(|| async { "ok" }))
        .route("/metrics", get(metrics))
        .route("/skus/{sku}", get(stock))
        .route("/skus/{sku}/orders", post(place_order))
        .with_state(state)
}

/// Serves `state` on `listener` until `shutdown` completes.
///
/// # Errors
/// I/O errors of the listener.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await
}

async fn stock(State(state): State<AppState>, Path(sku): Path<String>) -> Response {
    match state.inner.store.stock(&sku).await {
        Ok(Some(units)) => Json(serde_json::json!({ "sku": sku, "stock": units })).into_response(),
        Ok(None) => (StatusCode::NOT_FOUND, "unknown sku").into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("redis: {e}")).into_response(),
    }
}

async fn place_order(
    State(state): State<AppState>,
    Path(sku): Path<String>,
    Json(request): Json<OrderRequest>,
) -> Response {
    if sku.is_empty() || sku.len() > MAX_SKU_LEN {
        return (
            StatusCode::BAD_REQUEST,
            format!("a sku is 1 to {MAX_SKU_LEN} bytes"),
        )
            .into_response();
    }
    let result = match &state.inner.config.manager {
        Some(manager) => place_order_locked(manager, &state, &sku, &request).await,
        None => sell(&state, &sku, &request, None).await,
    };
    let (sale, error) = match result {
        Ok(sale) => (sale, None),
        Err(OrderError(e)) => (
            Sale {
                outcome: Outcome::Error,
                stock_read: None,
                token: None,
                store_token: None,
            },
            Some(e),
        ),
    };
    OrderResponse {
        outcome: sale.outcome,
        sku,
        order_id: request.order_id,
        instance: state.inner.config.instance,
        stock_read: sale.stock_read,
        token: sale.token.map(|t| t.to_string()),
        store_token: sale.store_token.map(|t| t.to_string()),
        error,
    }
    .into_response()
}

/// The order under the SKU's lock (`sku_{sku}` on the lock service, held across the read, the
/// check and the write). The write goes through `zklock::fence::current`, a writer that carries
/// the lock's fencing token, so a holder that lost the lock while it was paused cannot
/// overwrite what the next holder wrote. `on_lost = "continue"`: the
/// body runs to its end even if the hold is lost meanwhile, since the store's fence, not the
/// process's belief, is what refuses a stale write (a process frozen by SIGSTOP or a long GC
/// pause cannot notice its loss before it writes anyway).
#[distributed_lock("sku_{sku}", manager = manager, on_lost = "continue")]
async fn place_order_locked(
    manager: &LockManager,
    state: &AppState,
    sku: &str,
    request: &OrderRequest,
) -> Result<Sale, OrderError> {
    let writer = zklock::fence::current(state.inner.store.fence())
        .ok_or_else(|| OrderError("no fencing token inside the lock".into()))?;
    sell(state, sku, request, Some(&writer)).await
}

/// Read stock, check it, (work), write stock and record the order: separate Redis commands,
/// the write fenced when a lock's `writer` is given.
async fn sell(
    state: &AppState,
    sku: &str,
    request: &OrderRequest,
    writer: Option<&Fenced<'_, RedisFence>>,
) -> Result<Sale, OrderError> {
    let store = &state.inner.store;
    let token = writer.map(|w| w.token());
    let mut sale = Sale {
        outcome: Outcome::UnknownSku,
        stock_read: None,
        token,
        store_token: None,
    };
    let Some(stock) = store.stock(sku).await? else {
        return Ok(sale);
    };
    sale.stock_read = Some(stock);
    if stock <= 0 {
        sale.outcome = Outcome::OutOfStock;
        return Ok(sale);
    }
    if request.hold && state.inner.config.debug_hold {
        hold_for_debug(state, request, token, stock).await?;
    }
    if !state.inner.config.work.is_zero() {
        tokio::time::sleep(state.inner.config.work).await;
    }
    let record = format!(
        "{} {} {}",
        request.order_id,
        state.inner.config.instance,
        token.map(|t| t.to_string()).unwrap_or_else(|| "-".into())
    );
    match store.write(sku, stock - 1, &record, writer).await? {
        WriteOutcome::Written => sale.outcome = Outcome::Sold,
        WriteOutcome::Stale { last } => {
            sale.outcome = Outcome::Fenced;
            sale.store_token = Some(last);
        }
    }
    Ok(sale)
}

/// Announces that this order holds its lock with the stock read, then waits to be released.
async fn hold_for_debug(
    state: &AppState,
    request: &OrderRequest,
    token: Option<FencingToken>,
    stock: i64,
) -> Result<(), OrderError> {
    let mut conn = state.inner.store.dedicated_connection().await?;
    let event = format!(
        "{} {} {} {stock}",
        state.inner.config.instance,
        request.order_id,
        token.map(|t| t.to_string()).unwrap_or_else(|| "-".into())
    );
    redis::cmd("RPUSH")
        .arg(HOLDING_EVENTS)
        .arg(event)
        .query_async::<()>(&mut conn)
        .await?;
    let released: Option<(String, String)> = redis::cmd("BLPOP")
        .arg(release_key(&request.order_id))
        .arg(120)
        .query_async(&mut conn)
        .await?;
    match released {
        Some(_) => Ok(()),
        None => Err(OrderError("debug hold: not released within 120 s".into())),
    }
}
