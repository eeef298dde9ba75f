//! Unit tests of how a tunnel's first bytes are read for judging it: over
//! in-memory pipes standing for the client and the exit, on paused time.

use std::time::Duration;
use tokio::io::{duplex, AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::time::Instant;

use super::{read_first_bytes, sni, FIRST_BYTES_TIMEOUT};

/// A TLS handshake record with `payload` (a ClientHello's start will do:
/// only the record's length decides how much is read).
fn handshake_record(payload: &[u8]) -> Vec<u8> {
    let mut record = vec![22, 3, 1];
    record.extend_from_slice(&(payload.len() as u16).to_be_bytes());
    record.extend_from_slice(payload);
    record
}

/// The near ends the pipeline reads and, for the test, the far ends: what
/// the client and the exit write. Large enough that no write waits.
fn pipes() -> ((DuplexStream, DuplexStream), (DuplexStream, DuplexStream)) {
    let client = duplex(1 << 16);
    let exit = duplex(1 << 16);
    (client, exit)
}

/// `elapsed` is `expected` on paused time (to the timer's millisecond).
fn about(elapsed: Duration, expected: Duration) -> bool {
    elapsed >= expected && elapsed < expected + Duration::from_millis(2)
}

#[tokio::test(start_paused = true)]
async fn a_whole_first_record_is_read_even_when_it_comes_in_pieces() {
    let ((mut client, mut client_far), (mut exit, _exit_far)) = pipes();
    let record = handshake_record(&[1, 0, 0, 4, 3, 3, 9, 9]);
    client_far.write_all(&record[..3]).await.unwrap();
    let rest = record[3..].to_vec();
    let late = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        client_far.write_all(&rest).await.unwrap();
        client_far
    });
    let started = Instant::now();
    let (from_client, from_exit) = read_first_bytes(&mut client, &mut exit).await;
    assert_eq!(from_client, record);
    assert!(from_exit.is_empty());
    assert!(
        about(started.elapsed(), Duration::from_secs(1)),
        "waited for the rest"
    );
    drop(late.await.unwrap());
}

#[tokio::test(start_paused = true)]
async fn what_follows_the_record_stays_for_the_splice_or_is_forwarded_with_it() {
    let ((mut client, mut client_far), (mut exit, _exit_far)) = pipes();
    let record = handshake_record(&[1, 0, 0, 0]);
    let mut sent = record.clone();
    sent.extend_from_slice(b"application data");
    client_far.write_all(&sent).await.unwrap();
    drop(client_far);
    let (from_client, _) = read_first_bytes(&mut client, &mut exit).await;
    assert!(from_client.starts_with(&record));
    // Nothing is lost: what was read goes to the exit, the rest is spliced.
    let mut rest = Vec::new();
    client.read_to_end(&mut rest).await.unwrap();
    assert_eq!([from_client, rest].concat(), sent);
}

#[tokio::test(start_paused = true)]
async fn bytes_that_are_not_a_handshake_end_the_wait_at_once() {
    let ((mut client, mut client_far), (mut exit, _exit_far)) = pipes();
    client_far.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
    let started = Instant::now();
    let (from_client, from_exit) = read_first_bytes(&mut client, &mut exit).await;
    assert_eq!(from_client, b"GET / HTTP/1.1\r\n");
    assert!(from_exit.is_empty());
    assert_eq!(started.elapsed(), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn an_exit_that_speaks_first_ends_the_wait_and_its_bytes_come_back() {
    let ((mut client, _client_far), (mut exit, mut exit_far)) = pipes();
    exit_far
        .write_all(b"220 mail.example.test ESMTP\r\n")
        .await
        .unwrap();
    let started = Instant::now();
    let (from_client, from_exit) = read_first_bytes(&mut client, &mut exit).await;
    assert!(from_client.is_empty());
    assert_eq!(from_exit, b"220 mail.example.test ESMTP\r\n");
    assert_eq!(started.elapsed(), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn a_client_that_closes_is_judged_by_what_it_sent() {
    let ((mut client, mut client_far), (mut exit, _exit_far)) = pipes();
    client_far.write_all(&[22u8, 3, 1]).await.unwrap();
    drop(client_far);
    let started = Instant::now();
    let (from_client, from_exit) = read_first_bytes(&mut client, &mut exit).await;
    assert_eq!(from_client, [22u8, 3, 1]);
    assert!(from_exit.is_empty());
    assert_eq!(started.elapsed(), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn a_client_that_stops_mid_record_is_judged_without_after_the_timeout() {
    let ((mut client, mut client_far), (mut exit, _exit_far)) = pipes();
    client_far
        .write_all(&[22u8, 3, 1, 0, 200, 1])
        .await
        .unwrap();
    let started = Instant::now();
    let (from_client, from_exit) = read_first_bytes(&mut client, &mut exit).await;
    assert_eq!(from_client, [22u8, 3, 1, 0, 200, 1]);
    assert!(from_exit.is_empty());
    assert!(about(started.elapsed(), FIRST_BYTES_TIMEOUT));
    // The connection stays usable: the splice carries on from here.
    client_far.write_all(b"more").await.unwrap();
    let mut more = [0u8; 4];
    client.read_exact(&mut more).await.unwrap();
    assert_eq!(&more, b"more");
}

#[tokio::test(start_paused = true)]
async fn never_more_than_the_largest_record_is_read() {
    let ((mut client, mut client_far), (mut exit, _exit_far)) = pipes();
    let largest = handshake_record(&[1u8; sni::MAX_RECORD - 5]);
    assert_eq!(largest.len(), sni::MAX_RECORD);
    let mut sent = largest.clone();
    sent.extend_from_slice(&[0xee; 4096]);
    client_far.write_all(&sent).await.unwrap();
    let (from_client, _) = read_first_bytes(&mut client, &mut exit).await;
    assert_eq!(
        from_client, largest,
        "exactly the record, not a byte past it"
    );
    let mut next = [0u8; 1];
    client.read_exact(&mut next).await.unwrap();
    assert_eq!(next, [0xeeu8], "what follows is still in the connection");
}
