//! `Expect: 100-continue` end to end (RFC 9110 §10.1.1).
//!
//! A client that sends `Expect: 100-continue` waits for the origin's go-ahead
//! before it uploads. hyper's server answers `100 Continue` by itself the
//! moment the request body is first read, so a proxy that simply streams the
//! body onwards tells every client "go ahead" before the origin has decided,
//! and a client whose upload the origin refuses (401 before reading) uploads
//! it anyway. So the body sent upstream is gated: it is not read from the
//! client (and so no `100` goes to the client) until the origin sends its own
//! `100 Continue`. If the origin answers with a final response instead, that
//! response is relayed and the body is never read; hyper then closes the
//! client connection rather than read an upload nobody wants. An origin that
//! answers nothing at all within [`CONTINUE_WAIT`] (one that does not
//! implement the expectation, e.g. an HTTP/1.0 server) gets the body anyway,
//! as the RFC lets a client do after a wait.

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

/// How long the gate waits for the origin's first answer.
pub(crate) const CONTINUE_WAIT: Duration = Duration::from_secs(3);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Waiting for the origin.
    Closed,
    /// The origin said go (or did not answer in time): the body flows.
    Open,
    /// The origin gave its final answer without asking for the body: none
    /// is sent, whatever the wait says, while that answer is relayed.
    Answered,
    /// The exchange is over without the body: the upstream request ends.
    Abort,
}

#[derive(Debug)]
struct Shared {
    state: State,
    waker: Option<Waker>,
}

/// The switch the origin's answers throw.
#[derive(Clone, Debug)]
pub(crate) struct Gate(Arc<Mutex<Shared>>);

impl Gate {
    pub(crate) fn new() -> Self {
        Self(Arc::new(Mutex::new(Shared {
            state: State::Closed,
            waker: None,
        })))
    }

    fn set(&self, to: State) {
        if let Ok(mut shared) = self.0.lock() {
            let allowed = matches!(
                (shared.state, to),
                (State::Closed, _) | (State::Open | State::Answered, State::Abort)
            );
            if allowed {
                shared.state = to;
                if let Some(waker) = shared.waker.take() {
                    waker.wake();
                }
            }
        }
    }

    /// The origin sent `100 Continue`.
    pub(crate) fn open(&self) {
        self.set(State::Open);
    }

    /// The origin answered finally before asking for the body.
    pub(crate) fn answered(&self) {
        self.set(State::Answered);
    }

    /// The exchange is over: a body not yet sent never will be.
    pub(crate) fn abort(&self) {
        self.set(State::Abort);
    }

    fn state(&self) -> State {
        self.0.lock().map(|s| s.state).unwrap_or(State::Abort)
    }
}

impl Default for Gate {
    fn default() -> Self {
        Self::new()
    }
}

/// Whether the request asks for `100-continue` (RFC 9110 §10.1.1: the
/// value is case-insensitive; only this expectation is defined).
pub(crate) fn expects_continue(headers: &http::HeaderMap) -> bool {
    headers
        .get_all(http::header::EXPECT)
        .iter()
        .any(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"))
}

/// The client's request body as sent upstream: held back until the gate opens.
pub(crate) struct GatedBody<B> {
    inner: B,
    gate: Gate,
    /// Started at the first poll, when the head is on its way upstream (not
    /// while the tunnel is still being opened).
    wait: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<B> GatedBody<B> {
    pub(crate) fn new(inner: B, gate: Gate) -> Self {
        Self {
            inner,
            gate,
            wait: None,
        }
    }

    fn park(&self, cx: &Context<'_>) {
        if let Ok(mut shared) = self.gate.0.lock() {
            shared.waker = Some(cx.waker().clone());
        }
    }
}

impl<B> Body for GatedBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        // Registered first, so a change made while we look is not missed
        // (the body is polled again and sees it).
        self.park(cx);
        match self.gate.state() {
            // Polled while open: an abort (the exchange ended) wakes it.
            State::Open => Pin::new(&mut self.inner).poll_frame(cx).map_err(Into::into),
            State::Abort => Poll::Ready(Some(Err(
                "the origin answered without asking for the request body".into(),
            ))),
            State::Answered => Poll::Pending,
            State::Closed => {
                let wait = self
                    .wait
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(CONTINUE_WAIT)));
                if wait.as_mut().poll(cx).is_ready() {
                    // The origin said nothing: send the body as a client would.
                    self.gate.open();
                    if self.gate.state() == State::Open {
                        return Pin::new(&mut self.inner).poll_frame(cx).map_err(Into::into);
                    }
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        // The declared length, so the upstream request keeps its framing.
        self.inner.size_hint()
    }
}

/// A response body that aborts the gate when it ends (or is dropped): by
/// then the origin has said all it will, and a body it never asked for must
/// not keep the upstream connection waiting.
pub(crate) struct AbortOnEnd<B> {
    inner: B,
    gate: Gate,
}

impl<B> AbortOnEnd<B> {
    pub(crate) fn new(inner: B, gate: Gate) -> Self {
        Self { inner, gate }
    }
}

impl<B> Drop for AbortOnEnd<B> {
    fn drop(&mut self) {
        self.gate.abort();
    }
}

impl<B: Body + Unpin> Body for AbortOnEnd<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) {
            self.gate.abort();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Full};

    #[tokio::test]
    async fn the_body_waits_for_the_origin_and_never_flows_after_a_refusal() {
        let gate = Gate::new();
        let mut body = GatedBody::new(Full::new(Bytes::from_static(b"upload")), gate.clone());
        assert_eq!(body.size_hint().exact(), Some(6), "framing is kept");
        let early = tokio::time::timeout(Duration::from_millis(50), body.frame()).await;
        assert!(early.is_err(), "no byte before the origin says so");
        gate.open();
        let frame = body.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), Bytes::from_static(b"upload"));

        let refused = Gate::new();
        let mut body = GatedBody::new(Full::new(Bytes::from_static(b"x")), refused.clone());
        refused.answered();
        refused.open();
        let held = tokio::time::timeout(Duration::from_millis(50), body.frame()).await;
        assert!(held.is_err(), "a final answer keeps the body back");
        drop(AbortOnEnd::new(Full::new(Bytes::new()), refused.clone()));
        assert!(body.frame().await.unwrap().is_err(), "aborted, never sent");
        refused.open();
        assert!(body.frame().await.unwrap().is_err(), "an abort is final");
    }

    #[tokio::test(start_paused = true)]
    async fn a_final_answer_outlasting_the_wait_still_gets_no_body() {
        let gate = Gate::new();
        let mut body = GatedBody::new(Full::new(Bytes::from_static(b"no")), gate.clone());
        gate.answered();
        let held = tokio::time::timeout(CONTINUE_WAIT * 2, body.frame()).await;
        assert!(held.is_err(), "the wait does not open an answered gate");
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_origin_gets_the_body_after_the_wait() {
        let gate = Gate::new();
        let mut body = GatedBody::new(Full::new(Bytes::from_static(b"late")), gate);
        let frame = body.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), Bytes::from_static(b"late"));
    }

    #[test]
    fn the_expectation_is_recognised_in_any_case() {
        let mut h = http::HeaderMap::new();
        assert!(!expects_continue(&h));
        h.insert(http::header::EXPECT, "100-Continue".parse().unwrap());
        assert!(expects_continue(&h));
    }
}
