use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use http_body_util::BodyExt;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;

use super::*;
use crate::domain::{AdId, UserId};
use crate::upstream::{Call, Upstreams};

/// A keep-alive upstream counting the connections it accepted: 200 with a
/// phone, but `/users/404/` 404 with a body, `/users/500/` 500, a path from
/// `/close` 200 then a silent hang-up.
async fn upstream() -> (hyper::http::uri::Authority, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let authority = listener.local_addr().unwrap().to_string().parse().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buffer = Vec::new();
                while let Some(line) = read_head(&mut socket, &mut buffer).await {
                    let (status, body) = if line.contains("/users/404/") {
                        ("404 Not Found", "{}")
                    } else if line.contains("/users/500/") {
                        ("500 Internal Server Error", "{}")
                    } else {
                        ("200 OK", r#"{"phone": "+79161234567"}"#)
                    };
                    let reply = format!(
                        "HTTP/1.1 {status}\r\ncontent-length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    let close = line.starts_with("GET /close");
                    if socket.write_all(reply.as_bytes()).await.is_err() || close {
                        return;
                    }
                }
            });
        }
    });
    (authority, accepted)
}

/// One call whose answer is read in full and whose connection goes back.
async fn call(pool: &Pool, path: &str) {
    let phase = Phase::default();
    let mut conn = pool.take(&phase).await.unwrap();
    let request = hyper::Request::get(path).body(Empty::new()).unwrap();
    let response = pool
        .send(&mut conn, request, &phase, || Err(UpstreamError::Request))
        .await
        .unwrap();
    response.into_body().collect().await.unwrap();
    pool.put_back(conn);
}

#[tokio::test]
async fn a_connection_is_reused_only_after_its_answer_was_read() {
    let (authority, accepted) = upstream().await;
    let config = crate::config::Config::from_toml(&format!(
        "[upstreams.real_phone]\nbase_url = \"http://{authority}\""
    ))
    .unwrap();
    let upstreams = Upstreams::new(&config.upstreams, config.breaker, 16);
    let accepted = || accepted.load(Ordering::SeqCst);
    let ad = AdId::new(1).unwrap();
    let real_phone = |user| upstreams.real_phone(UserId::new(user).unwrap(), ad, Call::default());
    for _ in 0..3 {
        assert!(real_phone(1).await.unwrap().is_some());
    }
    assert_eq!(accepted(), 1, "kept alive");
    assert_eq!(real_phone(404).await, Ok(None));
    assert!(real_phone(1).await.unwrap().is_some());
    assert_eq!(
        accepted(),
        1,
        "a 404's answer is read, and its connection reused"
    );
    assert_eq!(real_phone(500).await, Err(UpstreamError::Status(500)));
    assert!(real_phone(1).await.unwrap().is_some());
    assert_eq!(
        accepted(),
        2,
        "the connection of an unread answer was reused"
    );
}

#[tokio::test]
async fn idle_connections_age_out_and_are_bounded() {
    let (authority, accepted) = upstream().await;
    let pool = Pool::new(&authority, Duration::from_millis(50), 2);
    call(&pool, "/ok").await;
    tokio::time::sleep(Duration::from_millis(120)).await;
    call(&pool, "/ok").await;
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        2,
        "an aged-out connection was taken"
    );

    let phase = Phase::default();
    let conns = [
        pool.take(&phase).await,
        pool.take(&phase).await,
        pool.take(&phase).await,
    ];
    for conn in conns {
        pool.put_back(conn.unwrap());
    }
    assert_eq!(
        pool.lock().len(),
        2,
        "more idle connections kept than the bound"
    );
}

/// The gateway's own socket trouble is undecided; a refusal or reset is the
/// upstream's verdict.
#[test]
fn errno_says_whose_trouble_a_connect_error_is() {
    use rustix::io::Errno;
    let local = [
        Errno::MFILE,
        Errno::NFILE,
        Errno::ADDRNOTAVAIL,
        Errno::NOBUFS,
        Errno::NOMEM,
    ];
    for errno in local {
        let error = io::Error::from_raw_os_error(errno.raw_os_error());
        assert!(connect_error(&error).undecided(), "{error}");
    }
    let upstream = [
        Errno::CONNREFUSED,
        Errno::CONNRESET,
        Errno::HOSTUNREACH,
        Errno::TIMEDOUT,
    ];
    for errno in upstream {
        let error = io::Error::from_raw_os_error(errno.raw_os_error());
        assert!(!connect_error(&error).undecided(), "{error}");
    }
}

#[tokio::test]
async fn a_failed_host_lookup_is_the_gateways_own_and_asks_nothing() {
    // A name that never resolves (RFC 6761): the lookup fails, locally.
    let authority = "gateway-test.invalid:80".parse().unwrap();
    let pool = Pool::new(&authority, Duration::from_secs(20), 4);
    let phase = Phase::default();
    let Err(error) = pool.take(&phase).await else {
        panic!("connected to .invalid");
    };
    assert!(error.undecided(), "{error:?}");
    assert!(!phase.asked());
}

/// A call whose timeout runs out while its host lookup waits for a place on
/// the blocking pool never asked the upstream: undecided, not a timeout.
#[test]
fn a_timeout_during_the_host_lookup_is_the_gateways_own() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(1)
        .build()
        .unwrap();
    runtime.block_on(async {
        // The one blocking thread is busy: the lookup waits for it.
        let (release, wait) = std::sync::mpsc::channel::<()>();
        let busy = tokio::task::spawn_blocking(move || {
            let _ = wait.recv();
        });
        let config = crate::config::Config::from_toml(
            "[upstreams.real_phone]\nbase_url = \"http://localhost:9\"\ntimeout_ms = 100",
        )
        .unwrap();
        let upstreams = Upstreams::new(&config.upstreams, config.breaker, 16);
        let (user, ad) = (UserId::new(1).unwrap(), AdId::new(1).unwrap());
        let got = upstreams.real_phone(user, ad, Call::default()).await;
        release.send(()).unwrap();
        busy.await.unwrap();
        assert_eq!(got, Err(UpstreamError::LocalTimeout));
    });
}

#[tokio::test]
async fn a_connection_the_upstream_closed_is_not_taken() {
    let (authority, accepted) = upstream().await;
    let pool = Pool::new(&authority, Duration::from_secs(20), 4);
    for _ in 0..5 {
        // Each connection is hung up on after its answer: never taken again.
        call(&pool, "/close").await;
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 5);
}

/// A reused connection whose task has ended hands the request back unwritten:
/// it is sent on a new connection. A connection opened for the call is not
/// retried.
#[tokio::test]
async fn a_request_a_closed_connection_never_wrote_is_sent_on_a_new_one() {
    let (authority, accepted) = upstream().await;
    let pool = Pool::new(&authority, Duration::from_secs(20), 4);
    // A connection whose task is gone: hyper refuses to write on it.
    let closed = || async {
        let stream = TcpStream::connect(pool.address.as_str()).await.unwrap();
        let (sender, connection) = http1::handshake(TokioIo::new(stream)).await.unwrap();
        drop(connection);
        sender
    };
    let phase = Phase::default();
    let mut conn = Conn {
        sender: closed().await,
        reused: true,
    };
    let request = hyper::Request::get("/ok").body(Empty::new()).unwrap();
    let response = pool
        .send(&mut conn, request, &phase, || Err(UpstreamError::Request))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert!(!conn.reused, "the new connection replaced the closed one");
    assert_eq!(accepted.load(Ordering::SeqCst), 2);

    let mut fresh = Conn {
        sender: closed().await,
        reused: false,
    };
    let request = hyper::Request::get("/ok").body(Empty::new()).unwrap();
    let error = pool
        .send(&mut fresh, request, &phase, || Err(UpstreamError::Request))
        .await
        .unwrap_err();
    assert!(!error.undecided(), "{error:?}");
    // The upstream's accept loop counts in its own time.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(accepted.load(Ordering::SeqCst), 3, "not retried");
}
