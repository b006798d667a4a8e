use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use http_body_util::BodyExt;

use super::*;
use crate::upstream::tests;

/// The upstream of `upstream::tests` and its count of accepted connections.
async fn upstream() -> (hyper::http::uri::Authority, Arc<AtomicUsize>) {
    let (address, accepted, _) = tests::upstream(false).await;
    (address.parse().unwrap(), accepted)
}

/// One call whose answer is read in full and whose connection goes back.
async fn call(pool: &Pool, path: &str) {
    let phase = Phase::default();
    let mut conn = pool.take(&phase).await.unwrap();
    let request = hyper::Request::get(path).body(Empty::new()).unwrap();
    let sent = pool.send(&mut conn, request, &phase, || Err(UpstreamError::Request));
    let response = sent.await.unwrap();
    response.into_body().collect().await.unwrap();
    pool.put_back(conn);
}

#[tokio::test]
async fn a_connection_is_reused_only_after_its_answer_was_read() {
    let (authority, accepted) = upstream().await;
    let upstreams = tests::upstreams(authority.as_str(), "");
    let accepted = || accepted.load(Ordering::SeqCst);
    let real_phone = |user| tests::real_phone(&upstreams, user, 1);
    for _ in 0..3 {
        assert!(real_phone(1).await.unwrap().is_some());
    }
    assert_eq!(accepted(), 1, "kept alive");
    assert_eq!(real_phone(404).await, Ok(None));
    assert!(real_phone(1).await.unwrap().is_some());
    let reused = "a 404's answer is read, and its connection reused";
    assert_eq!(accepted(), 1, "{reused}");
    assert_eq!(real_phone(500).await, Err(UpstreamError::Status(500)));
    assert!(real_phone(1).await.unwrap().is_some());
    let not_reused = "the connection of an unread answer was reused";
    assert_eq!(accepted(), 2, "{not_reused}");
}

#[tokio::test]
async fn idle_connections_age_out_and_are_bounded() {
    let (authority, accepted) = upstream().await;
    let pool = Pool::new(&authority, Duration::from_millis(50), 2);
    call(&pool, "/ok").await;
    tokio::time::sleep(Duration::from_millis(120)).await;
    call(&pool, "/ok").await;
    let accepted = accepted.load(Ordering::SeqCst);
    assert_eq!(accepted, 2, "an aged-out connection was taken");
    let phase = Phase::default();
    let conns = [
        pool.take(&phase).await,
        pool.take(&phase).await,
        pool.take(&phase).await,
    ];
    for conn in conns {
        pool.put_back(conn.unwrap());
    }
    let idle = pool.lock().len();
    assert_eq!(idle, 2, "more idle connections kept than the bound");
}

/// The gateway's own socket trouble is undecided; a refusal or reset is the
/// upstream's verdict.
#[test]
fn errno_says_whose_trouble_a_connect_error_is() {
    use rustix::io::Errno as E;
    let local = [E::MFILE, E::NFILE, E::ADDRNOTAVAIL, E::NOBUFS, E::NOMEM];
    let upstream = [E::CONNREFUSED, E::CONNRESET, E::HOSTUNREACH, E::TIMEDOUT];
    for (errnos, undecided) in [(&local[..], true), (&upstream, false)] {
        for errno in errnos {
            let error = io::Error::from_raw_os_error(errno.raw_os_error());
            assert_eq!(connect_error(&error).undecided(), undecided, "{error}");
        }
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
        let upstreams = tests::upstreams("localhost:9", "timeout_ms = 100");
        let got = tests::real_phone(&upstreams, 1, 1).await;
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
    let (pool, phase) = (&pool, &Phase::default());
    // A request sent on a connection whose task is gone: hyper refuses to
    // write on it. The answer, and whether the connection is still reused.
    let send_on_closed = |reused| async move {
        let stream = TcpStream::connect(pool.address.as_str()).await.unwrap();
        let (sender, connection) = http1::handshake(TokioIo::new(stream)).await.unwrap();
        drop(connection);
        let mut conn = Conn { sender, reused };
        let request = hyper::Request::get("/ok").body(Empty::new()).unwrap();
        let sent = pool.send(&mut conn, request, phase, || Err(UpstreamError::Request));
        (sent.await, conn.reused)
    };
    let (response, reused) = send_on_closed(true).await;
    assert_eq!(response.unwrap().status(), 200);
    assert!(!reused, "the new connection replaced the closed one");
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
    let error = send_on_closed(false).await.0.unwrap_err();
    assert!(!error.undecided(), "{error:?}");
    // The upstream's accept loop counts in its own time.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(accepted.load(Ordering::SeqCst), 3, "not retried");
}
