//! The baseline of the load harness: a bare axum hello-world on the same runtime
//! settings as the gateway, so `benches/load/harness.py` can compare the gateway
//! with the machine's HTTP limit in the same run.
//! Usage: `hello ADDR WORKERS`.

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let addr = args.next().unwrap_or_else(|| "127.0.0.1:19400".into());
    let workers: usize = args.next().and_then(|w| w.parse().ok()).unwrap_or(1);
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()?
        .block_on(async {
            let listener = tokio::net::TcpListener::bind(&addr).await?;
            let app =
                axum::Router::new().route("/", axum::routing::get(|| async { "Hello, World!" }));
            axum::serve(listener, app).await
        })
}
