//! Wiring: [`App::build`] turns a `Config` into bound listeners and the parts
//! behind them; [`App::run`] serves both listeners until the shutdown future ends.
//!
//! Listeners are bound in `build` so a test can ask for port 0 and read the
//! address before the app runs, exactly as `main` starts it.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context;
use tokio::net::TcpListener;

use crate::config::Config;
use crate::http::admin::AdminState;
use crate::http::{admin_router, public_router};
use crate::resolve::{Caches, Resolver};
use crate::status::{MemoryStore, StatusService, StatusStore};
use crate::upstream::Upstreams;

pub struct App {
    public: TcpListener,
    admin: TcpListener,
    public_router: axum::Router,
    admin_router: axum::Router,
    status: StatusService,
    caches: Caches,
    /// Flipped first on shutdown so `/readyz` turns 503 while requests drain.
    shutting_down: Arc<AtomicBool>,
}

impl App {
    /// Builds every part and binds both listeners.
    ///
    /// # Errors
    /// A listener address that cannot be bound, or an HTTP client that cannot be built.
    pub async fn build(config: Config) -> anyhow::Result<Self> {
        let store: Arc<dyn StatusStore> = Arc::new(MemoryStore::default());
        Self::build_with_store(config, store).await
    }

    /// As [`App::build`], with the status store given.
    ///
    /// # Errors
    /// As [`App::build`].
    pub async fn build_with_store(
        config: Config,
        store: Arc<dyn StatusStore>,
    ) -> anyhow::Result<Self> {
        let upstreams =
            Arc::new(Upstreams::new(&config.upstreams).context("building the HTTP client")?);
        let caches = Caches::new(&config);
        let status = StatusService::new(store);
        let resolver = Arc::new(Resolver::new(
            &config,
            upstreams,
            caches.clone(),
            status.set().clone(),
        ));
        let shutting_down = Arc::new(AtomicBool::new(false));
        let admin_state = AdminState {
            status: status.clone(),
            caches: caches.clone(),
            token: Arc::new(config.admin.token.clone()),
            shutting_down: shutting_down.clone(),
            metrics: crate::telemetry::metrics_handle(),
        };
        if config.admin.token.is_empty() {
            tracing::warn!("admin.token is empty: every /admin/ route answers 401");
        }
        let public = TcpListener::bind(config.server.public_addr)
            .await
            .with_context(|| format!("binding server.public_addr {}", config.server.public_addr))?;
        let admin = TcpListener::bind(config.server.admin_addr)
            .await
            .with_context(|| format!("binding server.admin_addr {}", config.server.admin_addr))?;
        Ok(App {
            public,
            admin,
            public_router: public_router(resolver, config.server.max_body_bytes),
            admin_router: admin_router(
                admin_state,
                config.server.max_body_bytes,
                config.server.max_snapshot_bytes,
            ),
            status,
            caches,
            shutting_down,
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

    /// The status write path (the demo seeds it).
    pub fn status(&self) -> &StatusService {
        &self.status
    }

    pub fn caches(&self) -> &Caches {
        &self.caches
    }

    /// Loads the status set, serves both listeners, and returns once `shutdown`
    /// has completed and in-flight requests have drained.
    ///
    /// # Errors
    /// A listener failed.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let status = self.status.clone();
        let loader = tokio::spawn(async move {
            let mut delay = std::time::Duration::from_millis(100);
            loop {
                match status.load().await {
                    Ok(count) => {
                        tracing::info!(count, "call-tracking status set loaded");
                        return;
                    }
                    Err(error) => {
                        tracing::warn!(%error, "loading the status set failed; retrying");
                        tokio::time::sleep(delay).await;
                        delay = (delay * 2).min(std::time::Duration::from_secs(5));
                    }
                }
            }
        });
        let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|stop| *stop).await;
        };
        let public = axum::serve(self.public, self.public_router)
            .with_graceful_shutdown(stopped(stop_rx.clone()));
        let admin =
            axum::serve(self.admin, self.admin_router).with_graceful_shutdown(stopped(stop_rx));
        let shutting_down = self.shutting_down;
        tokio::spawn(async move {
            shutdown.await;
            shutting_down.store(true, Ordering::Release);
            tracing::info!("shutting down: draining in-flight requests");
            let _ = stop_tx.send(true);
        });
        let (public, admin) = tokio::join!(public.into_future(), admin.into_future());
        loader.abort();
        public.context("public listener")?;
        admin.context("admin listener")?;
        Ok(())
    }
}
