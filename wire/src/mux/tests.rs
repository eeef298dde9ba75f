use super::*;
use bytes::Bytes;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

fn pair() -> (MuxHandle, MuxHandle) {
    let (a, b) = tokio::io::duplex(256 * 1024);
    let (client, client_conn) = start(a, Role::Client, MuxConfig::default());
    let (server, server_conn) = start(b, Role::Server, MuxConfig::default());
    tokio::spawn(client_conn);
    tokio::spawn(server_conn);
    (client, server)
}

/// Accepts every stream, answers "ok" and echoes it.
fn echo_server(server: MuxHandle) {
    tokio::spawn(async move {
        while let Some(incoming) = server.accept().await {
            tokio::spawn(async move {
                assert_eq!(&incoming.request[..], b"echo");
                let stream = incoming.reply(Bytes::from_static(b"ok"));
                let (mut r, mut w) = tokio::io::split(stream);
                tokio::io::copy(&mut r, &mut w).await.unwrap();
                w.shutdown().await.unwrap();
            });
        }
    });
}

#[tokio::test]
async fn streams_carry_more_than_their_window_both_ways_and_half_close() {
    let (client, server) = pair();
    echo_server(server);
    let (reply, stream) = client.open(Bytes::from_static(b"echo")).await.unwrap();
    assert_eq!(&reply[..], b"ok");
    let payload: Vec<u8> = (0..5_000_000u32).map(|i| (i % 253) as u8).collect();
    let expected = payload.clone();
    let (mut r, mut w) = tokio::io::split(stream);
    let writer = tokio::spawn(async move {
        w.write_all(&payload).await.unwrap();
        w.shutdown().await.unwrap();
    });
    let mut got = Vec::new();
    r.read_to_end(&mut got).await.unwrap();
    writer.await.unwrap();
    assert_eq!(got.len(), expected.len());
    assert!(got == expected);
}

#[tokio::test]
async fn stalled_streams_cannot_block_a_fresh_one() {
    let (client, server) = pair();
    // The acceptor floods every stream; the opener never reads the first 40.
    tokio::spawn(async move {
        while let Some(incoming) = server.accept().await {
            tokio::spawn(async move {
                let mut stream = incoming.reply(Bytes::from_static(b"ok"));
                let chunk = vec![1u8; 64 * 1024];
                for _ in 0..64 {
                    if stream.write_all(&chunk).await.is_err() {
                        return;
                    }
                }
                let _ = stream.shutdown().await;
            });
        }
    });
    let mut stalled = Vec::new();
    for _ in 0..40 {
        stalled.push(client.open(Bytes::from_static(b"x")).await.unwrap().1);
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let (_, mut fresh) = client.open(Bytes::from_static(b"x")).await.unwrap();
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), fresh.read_to_end(&mut got))
        .await
        .expect("a fresh stream was blocked by stalled ones")
        .unwrap();
    assert_eq!(got.len(), 64 * 64 * 1024);
    drop(stalled);
}

#[tokio::test]
async fn a_refusal_is_a_reply_then_a_reset() {
    let (client, server) = pair();
    tokio::spawn(async move {
        while let Some(incoming) = server.accept().await {
            drop(incoming.reply(Bytes::from_static(b"refused")));
        }
    });
    let (reply, mut stream) = client.open(Bytes::from_static(b"x")).await.unwrap();
    assert_eq!(&reply[..], b"refused");
    let mut buf = [0u8; 8];
    let err = stream.read(&mut buf).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset);
}

#[tokio::test]
async fn dropping_a_stream_resets_it_at_the_peer() {
    let (client, server) = pair();
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let incoming = server.accept().await.unwrap();
        let mut stream = incoming.reply(Bytes::from_static(b"ok"));
        let mut buf = [0u8; 8];
        let _ = tx.send(stream.read(&mut buf).await.map_err(|e| e.kind()));
        drop(server);
    });
    let (_, stream) = client.open(Bytes::from_static(b"x")).await.unwrap();
    drop(stream);
    assert_eq!(rx.await.unwrap(), Err(std::io::ErrorKind::ConnectionReset));
}

#[tokio::test]
async fn a_lost_transport_fails_open_streams_and_new_opens() {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let (client, client_conn) = start(a, Role::Client, MuxConfig::default());
    let (server, server_conn) = start(b, Role::Server, MuxConfig::default());
    let client_task = tokio::spawn(client_conn);
    let server_task = tokio::spawn(server_conn);
    echo_server(server);
    let (_, mut stream) = client.open(Bytes::from_static(b"echo")).await.unwrap();
    server_task.abort();
    let _ = server_task.await;
    let ended = client_task.await.unwrap();
    assert!(ended.is_err(), "an unexpected end is an error: {ended:?}");
    let mut buf = [0u8; 8];
    assert!(stream.read(&mut buf).await.is_err());
    assert!(matches!(
        client.open(Bytes::from_static(b"echo")).await,
        Err(OpenError::Unavailable)
    ));
}

#[tokio::test]
async fn dropping_every_handle_closes_the_link_once_streams_finish() {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let (client, client_conn) = start(a, Role::Client, MuxConfig::default());
    let (server, server_conn) = start(b, Role::Server, MuxConfig::default());
    let client_task = tokio::spawn(client_conn);
    let server_task = tokio::spawn(server_conn);
    echo_server(server);
    let (_, mut stream) = client.open(Bytes::from_static(b"echo")).await.unwrap();
    drop(client);
    // The open stream still works...
    stream.write_all(b"still here").await.unwrap();
    let mut buf = [0u8; 10];
    stream.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"still here");
    assert!(!client_task.is_finished());
    // ...and the link closes cleanly once it is done.
    stream.shutdown().await.unwrap();
    let mut rest = Vec::new();
    stream.read_to_end(&mut rest).await.unwrap();
    drop(stream);
    let client_end = client_task.await.unwrap();
    assert!(client_end.is_ok(), "{client_end:?}");
    let server_end = server_task.await.unwrap();
    assert!(server_end.is_ok(), "{server_end:?}");
}

#[tokio::test(start_paused = true)]
async fn a_silent_peer_fails_the_keepalive() {
    let (a, _b_never_read): (DuplexStream, DuplexStream) = tokio::io::duplex(64 * 1024);
    let (_client, client_conn) = start(a, Role::Client, MuxConfig::default());
    let started = tokio::time::Instant::now();
    let ended = client_conn.await;
    assert!(
        matches!(ended, Err(MuxError::KeepaliveTimeout)),
        "{ended:?}"
    );
    assert_eq!(started.elapsed(), Duration::from_secs(15));
}

#[tokio::test]
async fn garbage_from_the_peer_ends_the_link() {
    let (a, mut b) = tokio::io::duplex(64 * 1024);
    let (_server, server_conn) = start(a, Role::Server, MuxConfig::default());
    let task = tokio::spawn(server_conn);
    b.write_all(&[0xff; 64]).await.unwrap();
    assert!(matches!(task.await.unwrap(), Err(MuxError::Protocol(_))));
}

#[tokio::test]
async fn a_stream_sending_beyond_its_credit_ends_the_link() {
    use frame::{Frame, Kind};
    let (a, mut b) = tokio::io::duplex(4 << 20);
    let (server, server_conn) = start(a, Role::Server, MuxConfig::default());
    let task = tokio::spawn(server_conn);
    let accept = tokio::spawn(async move { server.accept().await.map(|i| i.reply(Bytes::new())) });
    let mut wire = Vec::new();
    let open = Frame::new(1, Kind::Open, 0, Bytes::from_static(b"x"));
    wire.extend_from_slice(&open.header);
    wire.extend_from_slice(&open.payload);
    for _ in 0..5 {
        let data = Frame::new(1, Kind::Data, 0, Bytes::from(vec![0u8; 256 * 1024]));
        wire.extend_from_slice(&data.header);
        wire.extend_from_slice(&data.payload);
    }
    b.write_all(&wire).await.unwrap();
    assert!(matches!(task.await.unwrap(), Err(MuxError::Protocol(_))));
    drop(accept);
}

#[tokio::test]
async fn a_spliced_stream_trades_buffers_both_ways_with_half_close() {
    use proxynet_common::splice::{splice, End, TunnelLimits};
    let (client, server) = pair();
    // The acceptor splices its stream with a plain pipe, as an agent does
    // with its target: the mux side trades buffers, the pipe side copies.
    let (target, mut target_peer) = tokio::io::duplex(64 * 1024);
    let spliced = tokio::spawn(async move {
        let incoming = server.accept().await.unwrap();
        let stream = incoming.reply(Bytes::from_static(b"ok"));
        let limits = TunnelLimits {
            idle_timeout: Duration::from_secs(60),
            max_lifetime: Duration::from_secs(60),
        };
        splice(stream, target, limits).await
    });
    let (_, stream) = client.open(Bytes::from_static(b"x")).await.unwrap();
    let (mut r, mut w) = tokio::io::split(stream);
    let up: Vec<u8> = (0..3_000_000u32).map(|i| (i % 249) as u8).collect();
    let down: Vec<u8> = (0..2_000_000u32).map(|i| (i % 247) as u8).collect();
    let (up_sent, down_sent) = (up.clone(), down.clone());
    let (_, got_down, got_up) = tokio::join!(
        async move {
            w.write_all(&up_sent).await.unwrap();
            w.shutdown().await.unwrap();
        },
        async move {
            let mut got = Vec::new();
            r.read_to_end(&mut got).await.unwrap();
            got
        },
        async move {
            let (mut tr, mut tw) = tokio::io::split(&mut target_peer);
            let (got, ()) = tokio::join!(
                async {
                    let mut got = Vec::new();
                    tr.read_to_end(&mut got).await.unwrap();
                    got
                },
                async {
                    tw.write_all(&down_sent).await.unwrap();
                    tw.shutdown().await.unwrap();
                }
            );
            got
        }
    );
    assert!(got_up == up, "upload corrupted ({} bytes)", got_up.len());
    assert!(
        got_down == down,
        "download corrupted ({} bytes)",
        got_down.len()
    );
    let outcome = spliced.await.unwrap();
    assert_eq!(
        (outcome.up, outcome.down, outcome.end),
        (3_000_000, 2_000_000, End::Closed)
    );
}

fn wire(frames: &[frame::Frame]) -> Vec<u8> {
    let mut out = Vec::new();
    for f in frames {
        out.extend_from_slice(&f.header);
        out.extend_from_slice(&f.payload);
    }
    out
}

#[tokio::test]
async fn a_side_that_only_opens_ends_the_link_on_a_peer_open() {
    use frame::{Frame, Kind};
    let (a, mut b) = tokio::io::duplex(64 * 1024);
    let config = MuxConfig {
        accepts_streams: false,
        ..MuxConfig::default()
    };
    let (_client, conn) = start(a, Role::Client, config);
    let task = tokio::spawn(conn);
    // Even ids are the server's to open.
    let open = Frame::new(2, Kind::Open, 0, Bytes::from_static(b"x"));
    b.write_all(&wire(&[open])).await.unwrap();
    let ended = task.await.unwrap();
    assert!(
        matches!(ended, Err(MuxError::Protocol("peer may not open streams"))),
        "{ended:?}"
    );
}

#[tokio::test]
async fn a_ping_flood_from_a_peer_that_never_reads_queues_one_pong() {
    use frame::{Frame, Kind};
    let (a, b) = tokio::io::duplex(16 * 1024);
    let (server, conn) = start(a, Role::Server, MuxConfig::default());
    let task = tokio::spawn(conn);
    let (_never_read, mut write) = tokio::io::split(b);
    let ping = Frame::new(0, Kind::Ping, 0, Bytes::from_static(&[7; 8]));
    let batch = wire(&[ping]).repeat(10_000);
    // 200,000 PINGs (4.4 MB) while our answers have nowhere to go.
    for _ in 0..20 {
        write.write_all(&batch).await.unwrap();
    }
    // Every PING was read (the writes above completed through a 16 KiB
    // pipe); the answers waiting are bounded by one PONG, not 200,000.
    tokio::task::yield_now().await;
    assert!(server.queued_bytes() <= 64, "{}", server.queued_bytes());
    assert!(!task.is_finished());
}

#[tokio::test(start_paused = true)]
async fn a_peer_that_sends_but_never_reads_is_given_up() {
    use frame::{Frame, Kind};
    let (a, b) = tokio::io::duplex(64 * 1024);
    let (client, conn) = start(a, Role::Client, MuxConfig::default());
    let started = tokio::time::Instant::now();
    let task = tokio::spawn(conn);
    let (_never_read, mut write) = tokio::io::split(b);
    // The peer stays audible (a PING a second), so only the write side stalls.
    tokio::spawn(async move {
        let ping = wire(&[Frame::new(0, Kind::Ping, 0, Bytes::from_static(&[0; 8]))]);
        while write.write_all(&ping).await.is_ok() {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
    // 400 KiB of OPEN requests: more than the pipe holds.
    for _ in 0..100 {
        let client = client.clone();
        tokio::spawn(async move { client.open(Bytes::from(vec![0u8; 4096])).await });
    }
    let ended = task.await.unwrap();
    assert!(matches!(ended, Err(MuxError::WriteStalled)), "{ended:?}");
    assert!(started.elapsed() >= Duration::from_secs(15));
    assert!(started.elapsed() < Duration::from_secs(17));
}

#[tokio::test]
async fn the_side_told_goaway_answers_so_both_close_cleanly() {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let (client, client_conn) = start(a, Role::Client, MuxConfig::default());
    let (server, server_conn) = start(b, Role::Server, MuxConfig::default());
    let client_task = tokio::spawn(client_conn);
    let server_task = tokio::spawn(server_conn);
    // The client winds down (GOAWAY); the server still holds its handle,
    // has nothing open, and so finishes too — telling the client first.
    drop(client);
    let server_end = server_task.await.unwrap();
    assert!(server_end.is_ok(), "{server_end:?}");
    let client_end = client_task.await.unwrap();
    assert!(client_end.is_ok(), "{client_end:?}");
    drop(server);
}

#[tokio::test]
async fn received_payloads_own_exactly_their_memory() {
    use frame::{Frame, Kind};
    use proxynet_common::splice::ChunkIo;
    use std::future::poll_fn;
    let (a, mut b) = tokio::io::duplex(4 << 20);
    let (server, conn) = start(a, Role::Server, MuxConfig::default());
    tokio::spawn(conn);
    // Long and short DATA frames back to back in one write, so they would
    // share one read block if payloads were slices of it.
    let mut frames = vec![Frame::new(1, Kind::Open, 0, Bytes::from_static(b"x"))];
    for len in [200 * 1024, 100, 40 * 1024, 5, 100 * 1024] {
        frames.push(Frame::new(1, Kind::Data, 0, Bytes::from(vec![7u8; len])));
    }
    b.write_all(&wire(&frames)).await.unwrap();
    let incoming = server.accept().await.unwrap();
    let mut stream = incoming.reply(Bytes::new());
    let mut total = 0;
    while total < 200 * 1024 + 100 + 40 * 1024 + 5 + 100 * 1024 {
        let chunk = poll_fn(|cx| std::pin::Pin::new(&mut stream).poll_read_chunk(cx))
            .await
            .unwrap()
            .unwrap();
        total += chunk.len();
        assert!(chunk.iter().all(|&x| x == 7));
        // Unique: no other payload (or read buffer) shares its allocation...
        let owned = chunk.try_into_mut().expect("a payload owns its buffer");
        // ...and it is no larger than the payload (nothing else pinned).
        assert!(
            owned.capacity() <= owned.len() + 64,
            "{} for {}",
            owned.capacity(),
            owned.len()
        );
    }
}

/// Stalled readers under a receive budget: each stream starts small, so a
/// reader that never reads holds at most that; one that reads grows to the
/// full window and moves everything; idle streams cost the budget nothing,
/// and the budget is whole again once the streams are gone.
#[tokio::test]
async fn a_receive_budget_bounds_what_stalled_streams_hold() {
    let budget = RecvBudget::new(64 * frame::STREAM_WINDOW as usize);
    let (a, b) = tokio::io::duplex(256 * 1024);
    let (client, client_conn) = start(
        a,
        Role::Client,
        MuxConfig {
            recv_budget: Some(budget.clone()),
            ..MuxConfig::default()
        },
    );
    let (server, server_conn) = start(b, Role::Server, MuxConfig::default());
    tokio::spawn(client_conn);
    tokio::spawn(server_conn);
    const EACH: usize = 4 << 20;
    let (sent_tx, mut sent_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    tokio::spawn(async move {
        while let Some(incoming) = server.accept().await {
            let window = u32::from_be_bytes(incoming.request[..4].try_into().unwrap());
            incoming.start_window(window);
            let sent = sent_tx.clone();
            tokio::spawn(async move {
                let mut stream = incoming.reply(Bytes::from_static(b"ok"));
                // One write of the whole window: it is queued at the reader
                // once the write returns (the credit allowed all of it).
                let first = vec![3u8; window as usize];
                if stream.write_all(&first).await.is_err() {
                    return;
                }
                let _ = sent.send(());
                let chunk = vec![3u8; 64 * 1024];
                let mut left = EACH - first.len();
                while left > 0 {
                    let n = left.min(chunk.len());
                    if stream.write_all(&chunk[..n]).await.is_err() {
                        return;
                    }
                    left -= n;
                }
                let _ = stream.shutdown().await;
            });
        }
    });
    let mut stalled = Vec::new();
    for _ in 0..20 {
        let window = client.next_window();
        assert_eq!(window, INITIAL_STREAM_WINDOW);
        let request = Bytes::copy_from_slice(&window.to_be_bytes());
        stalled.push(client.open_with_window(request, window).await.unwrap().1);
    }
    for _ in 0..20 {
        sent_rx.recv().await.unwrap();
    }
    // Every sender spent its first window; nothing more can be queued for a
    // reader that has not read.
    let held = budget.queued();
    assert!(
        held <= 20 * INITIAL_STREAM_WINDOW as usize,
        "{held} bytes held by 20 stalled streams"
    );
    // A stalled reader that reads again gets all of its bytes, through
    // windows that grow as it reads.
    let mut first = stalled.remove(0);
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), first.read_to_end(&mut got))
        .await
        .expect("a budgeted stream still moves everything")
        .unwrap();
    assert_eq!(got.len(), EACH);
    drop(first);
    drop(stalled);
    assert_eq!(budget.queued(), 0, "every stream gave its bytes back");
}
