//! Wiring: [`App::build`] turns a `Config` into bound listeners (bound here so a
//! test can read a port-0 address) and the parts behind them; [`App::run`] serves
//! them until shutdown. Which part reads which section: docs/development.md, "Layout".

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::budget::{self, Budgets};
use crate::cache::caches::Caches;
use crate::config::{Config, DatabaseConfig, ServerConfig};
use crate::http::api::access::AdminTokens;
use crate::http::api::durations::Durations;
use crate::http::api::routes;
use crate::http::api::snapshot::Uploads;
use crate::http::api::state::{AdminState, PublicState};
use crate::http::server::bodies::BodyBuffer;
use crate::http::server::conns::{self, Inbound};
use crate::http::server::front::Front;
use crate::http::server::serve::serve;
use crate::http::server::shed::Shed;
use crate::resolve::Resolver;
use crate::reveals::Reveals;
use crate::status::{StatusService, StatusSet};
use crate::store::{Database, Leadership, RevealStore};
use crate::upstream::Upstreams;

pub struct App {
    public: TcpListener,
    admin: TcpListener,
    probe: Option<(TcpListener, Front)>,
    public_front: Front,
    admin_front: Front,
    status: StatusService,
    /// Closed last; each part holds its own store handle made from it.
    database: Database,
    reveal_store: RevealStore,
    leadership: Leadership,
    upstreams: Arc<Upstreams>,
    /// `server.max_connections` as it applies ([`conns::max_connections`]).
    max_connections: usize,
    config: Config,
    budgets: Option<Arc<Budgets>>,
    reveals: Option<Reveals>,
    /// Flipped first on shutdown so `/readyz` turns 503 while requests drain.
    shutting_down: Arc<AtomicBool>,
    admission: Arc<crate::resolve::admission::Admission>,
    lost: Arc<crate::runtime::lost::LostTime>,
    /// Their files are re-read by a background task (rotation).
    tokens: Arc<AdminTokens>,
}

/// The parts that answer requests, built by one function that the app, the
/// whole-app tests (`tests/it/support/front.rs`) and the benches call.
pub struct Parts {
    pub upstreams: Arc<Upstreams>,
    pub caches: Caches,
    /// The resolver reads it; the app's status service writes it.
    pub status: Arc<StatusSet>,
    pub resolver: Arc<Resolver>,
    /// The viewer budgets; `None` when both are 0.
    pub budgets: Option<Arc<Budgets>>,
    /// The reveal log's buffer; `None` when `reveals.enabled` is false.
    pub reveals: Option<Reveals>,
    /// The request-duration histogram both listeners' fronts record into.
    pub durations: Arc<Durations>,
}

impl Parts {
    /// The parts of `config`; their background tasks start in [`App::run`].
    pub fn build(config: &Config) -> Self {
        let upstreams = Arc::new(Upstreams::new(
            &config.upstreams,
            config.breaker,
            // A bound of `0` on an upstream's calls in flight means the public
            // bound: each public request makes at most one call to each.
            config.server.max_in_flight,
        ));
        let caches = Caches::new(&config.cache);
        let status = Arc::new(StatusSet::default());
        Parts {
            resolver: Arc::new(Resolver::new(
                config,
                upstreams.clone(),
                caches.clone(),
                status.clone(),
            )),
            budgets: Budgets::new(&config.rate_limit),
            reveals: config
                .reveals
                .enabled
                .then(|| Reveals::new(&config.reveals)),
            upstreams,
            caches,
            status,
            durations: Arc::new(Durations::new(&routes::LABELS)),
        }
    }

    /// The public listener's front over these parts (bodies counted in `bodies`).
    pub fn public_front(&self, config: &Config, bodies: Option<&Arc<BodyBuffer>>) -> Front {
        let mut shed = Shed::new(config.server.max_in_flight, config.server.max_header_bytes);
        if let Some(bodies) = bodies {
            shed = shed.with_bodies(bodies, bodies.public_share());
        }
        let state = PublicState {
            resolver: self.resolver.clone(),
            budgets: self.budgets.clone(),
            reveals: self.reveals.clone(),
            server: config.server,
        };
        Front::public(state, shed, &config.tracing, self.durations.clone())
    }
}

impl App {
    /// Builds every part and binds both listeners. The status set is loaded by
    /// [`App::run`], so the listeners answer (and `/readyz` says 503) meanwhile.
    pub async fn build(config: Config) -> anyhow::Result<Self> {
        // The recorder first: the parts register their metrics as they are built.
        let metrics = crate::telemetry::metrics_handle();
        let database = Database::open(&config.database)
            .await
            .context("opening database.url")?;
        let reveal_store = database.reveals();
        let (max_connections, source) = conns::max_connections(
            config.server.max_connections,
            crate::runtime::open_files_limit(),
            config.outbound_descriptors(),
        );
        tracing::info!(
            max_connections,
            source,
            admin = conns::ADMIN_MAX_CONNECTIONS,
            "inbound connection cap"
        );
        let parts = Parts::build(&config);
        let status = StatusService::with_caches(
            database.status(),
            parts.status.clone(),
            parts.caches.clone(),
        );
        let admission = parts.resolver.admission();
        let lost = parts.upstreams.lost_time();
        // Read now, so an unreadable token file stops the start, naming its key.
        let tokens = Arc::new(AdminTokens::new(config.admin.read_tokens()?));
        let shutting_down = Arc::new(AtomicBool::new(false));
        let admin_state = AdminState {
            status: status.clone(),
            caches: parts.caches.clone(),
            durations: parts.durations.clone(),
            tokens: tokens.clone(),
            shutting_down: shutting_down.clone(),
            migrations: database.migrations().clone(),
            metrics,
            reveals: parts.reveals.clone(),
            reveal_store: reveal_store.clone(),
            budgets: parts.budgets.clone(),
            server: config.server,
            snapshot_uploads: Uploads::new(config.server.max_snapshot_uploads),
        };
        if tokens.is_empty() {
            tracing::warn!(
                "admin.token is empty and no [[admin.tokens]] is set: every /admin/ route answers 401"
            );
        }
        let (public, admin, probe) = bind(&config).await?;
        // The probes on a listener of their own, when asked: the admin
        // listener's open rows over the same state, never its body buffer.
        let probe = probe.map(|listener| {
            let front = Front::probes(
                admin_state.clone(),
                Shed::unlimited(config.server.max_header_bytes),
            );
            (listener, front)
        });
        let bodies = BodyBuffer::new(
            config.server.max_body_buffer_bytes,
            config.server.max_body_buffer_per_client_bytes,
        );
        Ok(App {
            public,
            admin,
            probe,
            public_front: parts.public_front(&config, Some(&bodies)),
            // The header limit only: the admin listener is never shed.
            admin_front: Front::admin(
                admin_state,
                Shed::unlimited(config.server.max_header_bytes)
                    .with_bodies(&bodies, bodies.admin_share()),
            ),
            tokens,
            budgets: parts.budgets,
            reveals: parts.reveals,
            status,
            leadership: database.leadership(config.upstreams.calltracking.status_feed.lease_ttl),
            database,
            reveal_store,
            upstreams: parts.upstreams,
            max_connections,
            config,
            shutting_down,
            admission,
            lost,
        })
    }

    pub fn public_addr(&self) -> SocketAddr {
        self.public
            .local_addr()
            .unwrap_or_else(|_| ([0, 0, 0, 0], 0).into())
    }

    pub fn admin_addr(&self) -> SocketAddr {
        self.admin
            .local_addr()
            .unwrap_or_else(|_| ([0, 0, 0, 0], 0).into())
    }

    /// The probe listener's address, when `server.probe_addr` is set.
    pub fn probe_addr(&self) -> Option<SocketAddr> {
        self.probe
            .as_ref()
            .and_then(|(listener, _)| listener.local_addr().ok())
    }

    /// The status write path (the demo seeds it).
    pub fn status(&self) -> &StatusService {
        &self.status
    }

    /// The upstreams' clients (their adaptive limits, for tests).
    pub fn upstreams(&self) -> &Arc<Upstreams> {
        &self.upstreams
    }

    /// The opened database (the demo migrates it before seeding).
    pub fn database(&self) -> &Database {
        &self.database
    }

    /// Serves both listeners and runs the background tasks until `shutdown`
    /// completes, requests have drained and the tasks stopped.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let background = Background::default();
        // Dropping `run` (a test, a caller giving up) stops the tasks too.
        let _stop_on_drop = background.token.clone().drop_guard();
        // A latch, cancelled once migrated and loaded: the other database work
        // waits for it, so a first start does not meet tables not there yet.
        let loaded = CancellationToken::new();
        // Cancelled once the reveal log's own migrations, which run beside
        // the answers, are done too: its writer and retention wait for it.
        let reveal_log = CancellationToken::new();
        // A mistake no retry mends (a pooler without a session): stops the app.
        let (fatal_tx, mut fatal_rx) = mpsc::channel::<String>(1);
        // Cancelled when the shutdown begins: duties that hand something on to
        // another replica (the feed's lease) stop then, not after the drain.
        let stopping = background.token.child_token();
        self.start_status(&background, [&loaded, &reveal_log], &stopping, fatal_tx);
        self.start_budgets(&background, &loaded);
        background.spawn(crate::telemetry::metrics_upkeep());
        background.spawn_until_stopped(|stop| crate::runtime::lost::probe(self.lost.clone(), stop));
        background.spawn_until_stopped(|stop| self.admission.clone().watch(stop));
        background.spawn(self.tokens.clone().watch());
        self.start_reveals(&background, &reveal_log);
        let (stop_tx, stop_rx) = watch::channel(false);
        let stopped = |mut rx: watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|stop| *stop).await;
        };
        let server = self.config.server;
        let public = serve(
            self.public,
            self.public_front,
            server,
            Inbound::new("public", self.max_connections),
            stopped(stop_rx.clone()),
        );
        let admin = serve(
            self.admin,
            self.admin_front,
            server,
            Inbound::making_room("admin", conns::ADMIN_MAX_CONNECTIONS),
            stopped(stop_rx.clone()),
        );
        // Stops with the others (its `/readyz` turns 503 first too); on its own thread.
        let probe = async {
            let Some((listener, front)) = self.probe else {
                return Ok(());
            };
            let listener = listener.into_std()?;
            crate::runtime::apart::run_apart("probe-listener", move || async move {
                serve(
                    TcpListener::from_std(listener)?,
                    front,
                    server,
                    Inbound::making_room("probe", conns::PROBE_MAX_CONNECTIONS),
                    stopped(stop_rx),
                )
                .await
            })
            .await?
        };
        let deadline_rx = start_shutdown(
            &background,
            shutdown,
            Stopping {
                shutting_down: self.shutting_down,
                duties: stopping,
            },
            &server,
            stop_tx,
        );
        let served = async { tokio::join!(public, admin, probe) };
        let (public, admin, probe) = tokio::select! {
            results = served => results,
            _ = deadline_rx => {
                tracing::warn!("drain deadline passed; dropping the remaining connections");
                (Ok(()), Ok(()), Ok(()))
            }
            Some(mistake) = fatal_rx.recv() => {
                background.stop().await;
                self.database.close().await;
                anyhow::bail!(mistake);
            }
        };
        background.stop().await;
        self.database.close().await;
        public.context("public listener")?;
        admin.context("admin listener")?;
        probe.context("probe listener")?;
        Ok(())
    }

    /// The status set's load (which opens `loaded`), then its sync and, when
    /// `status_feed.enabled`, the feed loop (which ends at `stopping`).
    fn start_status(
        &self,
        background: &Background,
        [loaded, reveal_log]: [&CancellationToken; 2],
        stopping: &CancellationToken,
        fatal: mpsc::Sender<String>,
    ) {
        let database = &self.config.database;
        background.spawn(load(
            self.status.clone(),
            self.database.clone(),
            database.clone(),
            [loaded.clone(), reveal_log.clone()],
            fatal,
        ));
        background.spawn(after(
            loaded,
            crate::status::sync::run(
                self.status.clone(),
                self.database.change_hints(database),
                database.sync_interval,
            ),
        ));
        let feed = &self.config.upstreams.calltracking.status_feed;
        if feed.enabled {
            let run = crate::status::feed::run(
                feed.clone(),
                self.status.clone(),
                self.leadership.clone(),
                self.upstreams.clone(),
                stopping.clone(),
            );
            let (ready, stopping) = (loaded.clone(), stopping.clone());
            // Not cut off: it stores the page under way and gives the lease
            // back once `stopping` is cancelled (bounded).
            background.spawn_until_stopped(|_| async move {
                tokio::select! {
                    () = ready.cancelled() => run.await,
                    () = stopping.cancelled() => {}
                }
            });
        }
    }

    /// The budget exchange, when any budget is on.
    fn start_budgets(&self, background: &Background, loaded: &CancellationToken) {
        let Some(budgets) = self.budgets.clone() else {
            return;
        };
        let store = self.database.budgets();
        let ready = loaded.clone();
        // Not cut off at the stop: it reports the last spends first.
        background.spawn_until_stopped(|stop| async move {
            tokio::select! {
                () = ready.cancelled() => {}
                () = stop.cancelled() => return,
            }
            budget::exchange::run(budgets, store, stop).await;
        });
    }

    /// The reveal log's flush and retention, when `reveals.enabled`.
    fn start_reveals(&self, background: &Background, reveal_log: &CancellationToken) {
        let Some(reveals) = self.reveals.clone() else {
            return;
        };
        let store = self.reveal_store.clone();
        let ready = reveal_log.clone();
        // Not cut off at the stop: it writes what is buffered first.
        background.spawn_until_stopped(|stop| async move {
            tokio::select! {
                () = ready.cancelled() => {}
                () = stop.cancelled() => {}
            }
            crate::reveals::flush::run_apart(reveals, store, stop).await;
        });
        background.spawn(after(
            reveal_log,
            crate::reveals::retention::run(self.config.reveals.clone(), self.reveal_store.clone()),
        ));
    }
}

/// Binds the three listeners (admin and probe with [`conns::LISTEN_BACKLOG`]).
async fn bind(config: &Config) -> anyhow::Result<(TcpListener, TcpListener, Option<TcpListener>)> {
    let server = &config.server;
    let public = TcpListener::bind(server.public_addr)
        .await
        .with_context(|| format!("binding server.public_addr {}", server.public_addr))?;
    let admin = conns::bind(server.admin_addr)
        .with_context(|| format!("binding server.admin_addr {}", server.admin_addr))?;
    let probe = match server.probe_addr {
        Some(addr) => {
            Some(conns::bind(addr).with_context(|| format!("binding server.probe_addr {addr}"))?)
        }
        None => None,
    };
    Ok((public, admin, probe))
}

/// What the shutdown's first step flips.
struct Stopping {
    /// `/readyz` answers 503 from then on.
    shutting_down: Arc<AtomicBool>,
    /// The duties that hand on to another replica stop.
    duties: CancellationToken,
}

/// The shutdown sequence once `shutdown` completes (docs/design.md, "Graceful
/// shutdown"); the returned receiver fires after the drain timeout.
fn start_shutdown(
    background: &Background,
    shutdown: impl Future<Output = ()> + Send + 'static,
    stopping: Stopping,
    server: &ServerConfig,
    stop: watch::Sender<bool>,
) -> oneshot::Receiver<()> {
    let pause = server.shutdown_pause;
    let drain = server.drain_timeout;
    let (deadline_tx, deadline_rx) = oneshot::channel::<()>();
    background.spawn(async move {
        shutdown.await;
        stopping.shutting_down.store(true, Ordering::Release);
        stopping.duties.cancel();
        tracing::info!(
            ?pause,
            "shutting down: /readyz answers 503; pausing for the load balancer"
        );
        tokio::time::sleep(pause).await;
        tracing::info!(
            ?drain,
            "shutting down: no new connections; draining in-flight requests"
        );
        let _ = stop.send(true);
        tokio::time::sleep(drain).await;
        let _ = deadline_tx.send(());
    });
    deadline_rx
}

/// The app's background tasks, stopped by one token whether `run` ends or is dropped.
#[derive(Default)]
struct Background {
    token: CancellationToken,
    tracker: TaskTracker,
}

impl Background {
    /// Runs `task` until it ends or the token is cancelled.
    fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        let token = self.token.clone();
        self.tracker.spawn(async move {
            token.run_until_cancelled(task).await;
        });
    }

    /// Runs `task(stop)`, which ends by itself once `stop` is cancelled (a last flush).
    fn spawn_until_stopped<F, Fut>(&self, task: F)
    where
        F: FnOnce(CancellationToken) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.tracker.spawn(task(self.token.clone()));
    }

    async fn stop(self) {
        self.token.cancel();
        self.tracker.close();
        self.tracker.wait().await;
    }
}

/// Runs `task` once `latch` is cancelled (see `loaded` in [`App::run`]).
fn after(
    latch: &CancellationToken,
    task: impl Future<Output = ()> + Send + 'static,
) -> impl Future<Output = ()> + Send + 'static {
    let latch = latch.clone();
    async move {
        latch.cancelled().await;
        task.await;
    }
}

/// The start's database work, each step retried until the database answers
/// (docs/operations.md, "Migrations at start"); a pooler without a session goes
/// to `fatal`: no retry mends it.
async fn load(
    status: StatusService,
    database: Database,
    config: DatabaseConfig,
    [loaded, reveal_log]: [CancellationToken; 2],
    fatal: mpsc::Sender<String>,
) {
    // The key whose connection must keep a session.
    let session = config.needs_session().then(|| match config.direct_url() {
        Some(_) => "database.direct_url",
        None => "database.url",
    });
    let migrate_on_start = config.migrate_on_start;
    let mut delay = START_RETRY_FIRST;
    let mut checked = session.is_none();
    // The reveal log's migrations left for after the load.
    let mut left = 0;
    loop {
        if !checked {
            match database.lacks_session().await {
                Ok(true) => {
                    let key = session.unwrap_or("database.url");
                    let _ = fatal.send(pooler_without_session(key)).await;
                    return;
                }
                Ok(false) => checked = true,
                // No answer yet (bounded): said, and asked again.
                Err(error) => {
                    let key = session.unwrap_or("database.url");
                    tracing::warn!(%error, key, "the pooler check cannot tell yet; retrying");
                }
            }
        }
        let result = async {
            if migrate_on_start {
                // To the end, however long: `/readyz` says which migration runs.
                left = database.migrate_for_answers().await?;
            }
            status.load().await
        };
        match result.await {
            Ok(count) if checked => {
                tracing::info!(
                    count,
                    store = database.kind(),
                    "call-tracking status set loaded"
                );
                loaded.cancel();
                break;
            }
            Ok(_) => {}
            Err(error) => {
                tracing::warn!(%error, "loading the status set failed; retrying");
            }
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(START_RETRY_MAX);
    }
    let mut delay = START_RETRY_FIRST;
    if left > 0 {
        while let Err(error) = database.migrate().await {
            tracing::warn!(
                %error,
                "the reveal log's migrations did not finish; reveals wait in memory; retrying"
            );
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(START_RETRY_MAX);
        }
    }
    reveal_log.cancel();
}

/// The first pause between two tries of the start's database work, doubled
/// after each failure: a database is usually late by a fraction of a second.
const START_RETRY_FIRST: Duration = Duration::from_millis(100);
const START_RETRY_MAX: Duration = Duration::from_secs(2);

/// What a replica says when the connection it needs a session on (`key`) is a
/// transaction-mode pooler (docs/status-sync.md, "Behind a transaction-mode pooler").
pub fn pooler_without_session(key: &str) -> String {
    let fix = if key == "database.url" {
        "set database.direct_url to PostgreSQL itself"
    } else {
        "point database.direct_url at PostgreSQL itself, not the pooler"
    };
    format!(
        "{key} is a transaction-mode pooler (a client connection does not keep its \
         server session), and migrations and LISTEN need one: {fix} \
         (or set database.migrate_on_start = false and database.listen = false)"
    )
}
