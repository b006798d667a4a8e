//! The snapshot PUT: up to 10,000,000 ids, parsed as the body streams in through
//! bounded channels on a parser thread of its own (not tokio's blocking pool,
//! where host lookups run: it blocks while the body trickles in). A database
//! connection is taken only once the body is complete and valid, so a trickling
//! upload holds no connection or lock; uploads in flight are bounded ([`Uploads`]).

use std::fmt;
use std::io::{self, Read};

use std::sync::Arc;

use axum::body::{Body, Bytes};
use futures_util::StreamExt;
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError, mpsc, oneshot};

use super::error::ApiError;
use crate::domain::MAX_VERSION;
use crate::domain::UserId;
use crate::status::StatusService;

const ID_CHUNK: usize = 100_000;
pub const MAX_SNAPSHOT_IDS: usize = 10_000_000;
const TOO_LARGE: &str = "snapshot body over the limit";
const TIMED_OUT: &str = "snapshot body not received in time";

/// The snapshot uploads in flight (`server.max_snapshot_uploads`): each holds its
/// ids and a parser thread, so one more is refused before its body is read.
#[derive(Debug, Clone)]
pub struct Uploads {
    permits: Arc<Semaphore>,
}

impl Uploads {
    pub fn new(max: usize) -> Self {
        Uploads {
            permits: Arc::new(Semaphore::new(max)),
        }
    }

    /// An upload's place, held until it is answered; a 503 with `Retry-After`
    /// when `max` are in flight already.
    pub fn start(&self) -> Result<OwnedSemaphorePermit, ApiError> {
        match self.permits.clone().try_acquire_owned() {
            Ok(permit) => Ok(permit),
            Err(TryAcquireError::NoPermits | TryAcquireError::Closed) => {
                tracing::warn!(
                    "a snapshot upload was refused: server.max_snapshot_uploads are in flight"
                );
                Err(ApiError::Unavailable {
                    detail: "too many snapshot uploads at once; retry later",
                })
            }
        }
    }
}

#[derive(Clone, Copy)]
enum Forwarded {
    Done,
    TooLarge,
    TimedOut,
}

/// Streams `body` into a snapshot and applies it; returns (version, ids read).
/// A 400 for a bad body, 413 over `limit` bytes, 503 when the store fails.
pub async fn load(
    status: &StatusService,
    body: Body,
    limits: super::limits::BodyLimit,
) -> Result<(u64, usize), ApiError> {
    let limit = limits.max_bytes;
    let (bytes_tx, bytes_rx) = mpsc::channel::<io::Result<Bytes>>(4);
    let (ids_tx, mut ids_rx) = mpsc::channel::<Vec<u64>>(2);
    let idle = limits.read_timeout;
    let deadline = tokio::time::Instant::now() + limits.total_timeout;
    let forward = tokio::spawn(async move {
        let mut stream = body.into_data_stream();
        let mut total = 0usize;
        loop {
            let next = (tokio::time::Instant::now() + idle).min(deadline);
            let Ok(chunk) = tokio::time::timeout_at(next, stream.next()).await else {
                let _ = bytes_tx.send(Err(io::Error::other(TIMED_OUT))).await;
                return Forwarded::TimedOut;
            };
            let Some(chunk) = chunk else { break };
            let chunk = match chunk {
                Ok(chunk) => chunk,
                Err(e) => {
                    let _ = bytes_tx.send(Err(io::Error::other(e))).await;
                    return Forwarded::Done;
                }
            };
            total += chunk.len();
            if total > limit {
                let _ = bytes_tx.send(Err(io::Error::other(TOO_LARGE))).await;
                return Forwarded::TooLarge;
            }
            if bytes_tx.send(Ok(chunk)).await.is_err() {
                return Forwarded::Done;
            }
        }
        Forwarded::Done
    });
    // Not the blocking pool (see the module doc). A parser that panicked drops
    // `parsed_tx`, which reads as an unreadable body below.
    let (parsed_tx, parsed_rx) = oneshot::channel();
    let parser = std::thread::Builder::new()
        .name("snapshot-parser".into())
        .spawn(move || {
            let reader = io::BufReader::with_capacity(
                64 * 1024,
                ChannelReader {
                    rx: bytes_rx,
                    current: Bytes::new(),
                },
            );
            let _ = parsed_tx.send(parse(reader, |chunk| ids_tx.blocking_send(chunk).is_ok()));
        });
    if let Err(error) = parser {
        tracing::error!(%error, "no thread for the snapshot parser");
        forward.abort();
        return Err(ApiError::Unavailable {
            detail: "the snapshot cannot be read right now; retry later",
        });
    }

    // The whole body first: no connection is taken while a client is slow.
    let mut chunks = Vec::new();
    while let Some(ids) = ids_rx.recv().await {
        chunks.push(ids);
    }
    let parsed = parsed_rx
        .await
        .map_err(|_| ApiError::bad_request("could not read the body"))?;
    let forwarded = forward.await.unwrap_or(Forwarded::Done);
    let version = match (parsed, forwarded) {
        (Ok(version), _) => version,
        (Err(_), Forwarded::TooLarge) => return Err(ApiError::PayloadTooLarge(limit)),
        (Err(_), Forwarded::TimedOut) => return Err(ApiError::RequestTimeout),
        (Err(e), Forwarded::Done) => {
            return Err(ApiError::bad_request(format!("invalid snapshot: {e}")));
        }
    };
    let mut load = status.begin_snapshot().await?;
    let mut count = 0;
    for ids in &chunks {
        count += ids.len();
        load.push(ids).await?;
    }
    // The ids too: the replica applies them to its own memory before the
    // answer (a 2xx means this replica's lookups see the snapshot).
    status.finish_snapshot(load, version, chunks).await?;
    Ok((version, count))
}

/// Parses a snapshot body from `reader`, handing ids to `deliver` in chunks (it
/// answers false to abandon the parse); returns the version. Blocking.
pub fn parse(
    reader: impl Read,
    deliver: impl FnMut(Vec<u64>) -> bool,
) -> Result<u64, serde_json::Error> {
    let mut deserializer = serde_json::Deserializer::from_reader(reader);
    let version = SnapshotSeed {
        sink: Sink {
            deliver: Box::new(deliver),
            chunk: Vec::new(),
        },
    }
    .deserialize(&mut deserializer)?;
    deserializer.end()?;
    Ok(version)
}

struct ChannelReader {
    rx: mpsc::Receiver<io::Result<Bytes>>,
    current: Bytes,
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.current.is_empty() {
            match self.rx.blocking_recv() {
                None => return Ok(0),
                Some(chunk) => self.current = chunk?,
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current.split_to(n));
        Ok(n)
    }
}

struct Sink<'a> {
    deliver: Box<dyn FnMut(Vec<u64>) -> bool + 'a>,
    chunk: Vec<u64>,
}

impl Sink<'_> {
    fn push<E: de::Error>(&mut self, id: u64) -> Result<(), E> {
        self.chunk.push(id);
        if self.chunk.len() >= ID_CHUNK {
            self.flush()
        } else {
            Ok(())
        }
    }

    fn flush<E: de::Error>(&mut self) -> Result<(), E> {
        if self.chunk.is_empty() {
            return Ok(());
        }
        let chunk = std::mem::replace(&mut self.chunk, Vec::with_capacity(ID_CHUNK));
        if (self.deliver)(chunk) {
            Ok(())
        } else {
            Err(E::custom("the snapshot was abandoned"))
        }
    }
}

struct SnapshotSeed<'a> {
    sink: Sink<'a>,
}

impl<'de> DeserializeSeed<'de> for SnapshotSeed<'_> {
    type Value = u64;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<u64, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for SnapshotSeed<'_> {
    type Value = u64;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(r#"{"version": V, "enabled_user_ids": [...]}"#)
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<u64, A::Error> {
        let mut version = None;
        let mut ids_seen = false;
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            match &*key {
                "version" => version = Some(map.next_value::<u64>()?),
                "enabled_user_ids" if ids_seen => {
                    return Err(de::Error::custom("enabled_user_ids: given twice"));
                }
                "enabled_user_ids" => {
                    ids_seen = true;
                    map.next_value_seed(Ids {
                        sink: &mut self.sink,
                    })?;
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        if !ids_seen {
            return Err(de::Error::custom("enabled_user_ids: required"));
        }
        match version {
            Some(v) if (1..=MAX_VERSION).contains(&v) => {
                self.sink.flush()?;
                Ok(v)
            }
            Some(_) => Err(de::Error::custom(format!(
                "version: must be an integer in 1..={MAX_VERSION}"
            ))),
            None => Err(de::Error::custom("version: required")),
        }
    }
}

struct Ids<'a, 'b> {
    sink: &'a mut Sink<'b>,
}

impl<'de> DeserializeSeed<'de> for Ids<'_, '_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Ids<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array of user ids")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut index = 0usize;
        while let Some(id) = seq.next_element::<u64>()? {
            if UserId::new(id).is_err() {
                return Err(de::Error::custom(format!(
                    "enabled_user_ids[{index}]: must be an integer in 1..={}",
                    UserId::MAX
                )));
            }
            index += 1;
            if index > MAX_SNAPSHOT_IDS {
                return Err(de::Error::custom(format!(
                    "enabled_user_ids: at most {MAX_SNAPSHOT_IDS} ids"
                )));
            }
            self.sink.push(id)?;
        }
        Ok(())
    }
}
