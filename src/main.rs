//! The `phones-gateway` command: `serve`, `check-config`, `migrate`, `simulate`,
//! `demo` (the default).

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use phones_gateway::app::App;
use phones_gateway::config::{Config, DatabaseConfig, LogConfig, LogFormat, Secret};
use phones_gateway::domain::StatusItem;
use phones_gateway::sim::{self, SimConfig};

/// mimalloc rather than glibc's malloc: docs/performance.md, "The allocator".
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `--version`: the crate's version and the commit it was built from.
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("PHONES_GATEWAY_COMMIT"),
    ")"
);

#[derive(Parser)]
#[command(
    version = VERSION,
    about = "Decides which phone number a buyer sees for a classified ad."
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Run the service.
    Serve {
        /// A TOML file layered over the built-in defaults (config/default.toml).
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Load and validate the configuration, print the verdict, and exit.
    CheckConfig {
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Apply the database migrations that are pending, list them, and exit.
    Migrate {
        #[arg(long)]
        config: Option<PathBuf>,
        /// List the migrations applied and pending, and apply nothing.
        #[arg(long)]
        status: bool,
    },
    /// Run the upstream simulator (all three upstreams and the status feed).
    Simulate(SimConfig),
    /// Run the service on 127.0.0.1 against an in-process simulator (the default).
    Demo {
        #[arg(long)]
        config: Option<PathBuf>,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command.unwrap_or(Command::Demo { config: None }) {
        Command::Serve { config } => run_serve(load(config)),
        Command::CheckConfig { config } => check_config(config),
        Command::Migrate { config, status } => run_migrate(load(config), status),
        Command::Simulate(sim_config) => {
            phones_gateway::telemetry::init_logs(&LogConfig {
                filter: "info".to_owned(),
                format: LogFormat::Text,
            })?;
            runtime(0)?.block_on(simulate(sim_config))
        }
        Command::Demo { config } => run_demo(load(config)),
    }
}

/// `serve`: the service as configured, until a signal stops it.
fn run_serve(config: Config) -> anyhow::Result<()> {
    // Dropped last, after the runtime: the spans still buffered go out then.
    let _export = phones_gateway::telemetry::init_logs_and_traces(&config.log, &config.tracing)?;
    log_mistyped_environment();
    // Before the runtime and its threads allocate: see runtime::no_huge_pages.
    phones_gateway::runtime::no_huge_pages();
    phones_gateway::runtime::raise_open_files();
    let served = runtime(config.runtime.worker_threads)?.block_on(serve(config));
    // A start-up mistake is one line and exit status 1, not an anyhow report
    // (with RUST_BACKTRACE=1, followed by a backtrace of main).
    if let Err(error) = served {
        tracing::error!("{error:#}");
        eprintln!("Error: {error:#}");
        std::process::exit(1);
    }
    Ok(())
}

/// `check-config`: loads and validates, warning of what is likely a mistake.
fn check_config(file: Option<PathBuf>) -> anyhow::Result<()> {
    // `load` names the mistyped variables itself when it fails.
    let config = load(file);
    for warning in mistyped_environment() {
        eprintln!("phones-gateway: warning: {warning}");
    }
    // The token files, read as `serve` reads them at start.
    let tokens = match config.admin.read_tokens() {
        Ok(tokens) => tokens,
        Err(error) => {
            eprintln!("phones-gateway: {error}");
            std::process::exit(2);
        }
    };
    if tokens.is_empty() {
        eprintln!(
            "phones-gateway: warning: admin.token is empty and no [[admin.tokens]] is set: \
             every /admin/ route will answer 401 (set PHONES_GATEWAY__ADMIN__TOKEN)"
        );
    }
    println!("configuration ok");
    Ok(())
}

/// `migrate`: applies the pending migrations, saying which (`--status`: lists only).
fn run_migrate(config: Config, status_only: bool) -> anyhow::Result<()> {
    phones_gateway::telemetry::init_logs(&config.log)?;
    log_mistyped_environment();
    let database = DatabaseConfig {
        max_connections: 1,
        ..config.database
    };
    runtime(1)?.block_on(async {
        let database = phones_gateway::store::Database::open(&database).await?;
        let store = database.kind();
        let before = database.migration_status().await?;
        if status_only {
            for migration in &before {
                let state = if migration.applied {
                    "applied"
                } else {
                    "pending"
                };
                println!("{state}  {}", migration_name(migration));
            }
            let pending = before.iter().filter(|m| !m.applied).count();
            println!(
                "{store}: {} applied, {pending} pending",
                before.len() - pending
            );
            return anyhow::Ok(());
        }
        let started = tokio::time::Instant::now();
        // No client bound on the whole run: a migration that rightly
        // takes long (an index on a large table) runs here, not at start.
        database.migrate_within(None).await?;
        let seconds = started.elapsed().as_secs_f64();
        let after = database.migration_status().await?;
        let was_applied = |version| before.iter().any(|m| m.version == version && m.applied);
        let mut applied_now = 0;
        for migration in after
            .iter()
            .filter(|m| m.applied && !was_applied(m.version))
        {
            println!("applied  {}", migration_name(migration));
            applied_now += 1;
        }
        let pending: Vec<String> = after
            .iter()
            .filter(|m| !m.applied)
            .map(migration_name)
            .collect();
        for name in &pending {
            println!("pending  {name}");
        }
        println!(
            "{store}: {applied_now} applied now, {} applied, {} pending",
            after.len() - pending.len(),
            pending.len()
        );
        if applied_now == 0 {
            tracing::info!(
                store,
                pending = pending.len(),
                "no migration pending: nothing applied"
            );
        } else {
            tracing::info!(
                store,
                applied = applied_now,
                pending = pending.len(),
                seconds,
                "migrations applied"
            );
        }
        anyhow::Ok(())
    })
}

/// A migration as its file is named: `0011 reveal buckets`.
fn migration_name(migration: &phones_gateway::store::MigrationState) -> String {
    format!("{:04} {}", migration.version, migration.description)
}

/// `demo` (and no command): the service and the simulator together.
fn run_demo(config: Config) -> anyhow::Result<()> {
    // The demo always writes text (`log.format` is for collectors).
    let log = LogConfig {
        format: LogFormat::Text,
        ..config.log.clone()
    };
    let _export = phones_gateway::telemetry::init_logs_and_traces(&log, &config.tracing)?;
    log_mistyped_environment();
    phones_gateway::runtime::no_huge_pages();
    phones_gateway::runtime::raise_open_files();
    runtime(config.runtime.worker_threads)?.block_on(demo(config))
}

/// A multi-threaded runtime sized by `runtime::worker_threads`.
fn runtime(configured: usize) -> anyhow::Result<tokio::runtime::Runtime> {
    let (workers, source) = phones_gateway::runtime::worker_threads(configured);
    tracing::info!(workers, source, "tokio worker threads");
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .context("starting the tokio runtime")
}

/// The configuration, or every mistake in it (and the environment variables
/// that look mistyped) on stderr and exit status 2: not an `anyhow` error,
/// which `RUST_BACKTRACE=1` follows with a backtrace that says nothing of it.
fn load(file: Option<PathBuf>) -> Config {
    match Config::load(file.as_deref()) {
        Ok(config) => config,
        Err(error) => {
            for warning in mistyped_environment() {
                eprintln!("phones-gateway: warning: {warning}");
            }
            eprintln!("phones-gateway: {error}");
            std::process::exit(2);
        }
    }
}

/// A warning for each variable `config::mistyped_environment` finds.
fn mistyped_environment() -> Vec<String> {
    phones_gateway::config::mistyped_environment()
        .into_iter()
        .map(|name| {
            format!(
                "environment variable {name} is not read: overrides start with {} (two underscores)",
                phones_gateway::config::ENV_PREFIX
            )
        })
        .collect()
}

/// The variables of [`mistyped_environment`] as log lines, once logging is up.
fn log_mistyped_environment() {
    for variable in phones_gateway::config::mistyped_environment() {
        tracing::warn!(
            %variable,
            "environment variable not read: overrides start with PHONES_GATEWAY__"
        );
    }
}

async fn serve(config: Config) -> anyhow::Result<()> {
    tracing::info!(
        version = phones_gateway::telemetry::VERSION,
        commit = phones_gateway::telemetry::COMMIT,
        "phones-gateway starting"
    );
    let app = App::build(config).await?;
    let probe = app
        .probe_addr()
        .map_or_else(|| "off".to_owned(), |addr| addr.to_string());
    tracing::info!(public = %app.public_addr(), admin = %app.admin_addr(), probe, "listening");
    app.run(shutdown_signal()).await
}

async fn simulate(config: SimConfig) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(config.addr)
        .await
        .with_context(|| format!("binding {}", config.addr))?;
    tracing::info!(addr = %listener.local_addr()?, "simulator listening");
    sim::serve(listener, config, shutdown_signal()).await?;
    Ok(())
}

async fn demo(mut config: Config) -> anyhow::Result<()> {
    let sim_config = SimConfig {
        latency_ms: 20,
        ..SimConfig::default()
    };
    let statuses = sim_config.statuses;
    let sim_listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
    let sim_url = format!("http://{}", sim_listener.local_addr()?);
    tokio::spawn(sim::serve(sim_listener, sim_config, std::future::pending()));

    config.upstreams.real_phone.base_url = sim_url.clone();
    config.upstreams.anonymous.base_url = sim_url.clone();
    config.upstreams.calltracking.upstream.base_url = sim_url;
    config.server.public_addr.set_ip([127, 0, 0, 1].into());
    config.server.admin_addr.set_ip([127, 0, 0, 1].into());
    if config.admin.token.is_empty() {
        config.admin.token = Secret::new(random_token()?);
    }
    let token = config.admin.token.clone();
    let app = App::build(config).await?;
    // What the simulated status feed holds, as the webhook would deliver it.
    let items = (1..=statuses)
        .map(|i| {
            StatusItem {
                user_id: i * 4,
                enabled: true,
                version: 1,
            }
            .parse()
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow::anyhow!("demo statuses: {e}"))?;
    app.database().migrate().await?;
    for chunk in items.chunks(10_000) {
        app.status().apply_changes(chunk, None).await?;
    }

    let (public, admin) = (app.public_addr(), app.admin_addr());
    println!(
        "\nphones-gateway demo: simulated upstreams (20 ms latency), {statuses} call-tracking sellers\n\
         public API  http://{public}\n\
         admin API   http://{admin}   token: {token}\n\n\
         try:\n\
         \x20 curl -s 'http://{public}/v1/public-phone?user_id=41&ad_id=1001&category_id=1'   # real\n\
         \x20 curl -s 'http://{public}/v1/public-phone?user_id=40&ad_id=1001&category_id=1'   # calltracking\n\
         \x20 curl -s 'http://{public}/v1/public-phone?user_id=41&ad_id=1003&category_id=9'   # anonymous\n\
         \x20 curl -s 'http://{public}/v1/public-phone?user_id=50&ad_id=1001&category_id=1'   # 404, no phone\n\
         \x20 curl -s -H 'Content-Type: application/json' -XPOST http://{public}/v1/public-phones/batch -d '{{\"items\":[{{\"user_id\":41,\"ad_id\":1,\"category_id\":1}},{{\"user_id\":0,\"ad_id\":2,\"category_id\":1}}]}}'\n\
         \x20 curl -s -H 'Authorization: Bearer {token}' http://{admin}/admin/v1/calltracking/statuses/40\n\
         \x20 curl -s -H 'Authorization: Bearer {token}' -H 'Content-Type: application/json' -XPOST http://{admin}/admin/v1/calltracking/statuses -d '{{\"items\":[{{\"user_id\":41,\"enabled\":true,\"version\":2}}]}}'\n\
         \x20 curl -s http://{admin}/metrics\n\nCtrl-C stops it.\n",
        token = token.expose(),
    );
    app.run(shutdown_signal()).await
}

fn random_token() -> anyhow::Result<String> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| anyhow::anyhow!("no randomness: {e}"))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}
